"""Ray Serve applications: scoring pipeline and tokenizer endpoint."""
