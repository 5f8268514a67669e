"""Kafka security settings reach every client: one mapping to librdkafka properties, which every client accepts.

No broker with TLS or SASL runs here (the embedded Tansu broker is plaintext), so these tests check the
client configuration itself: librdkafka validates properties and loads the TLS files when a client is
made, so a producer and a consumer built from the settings prove the settings are well formed and used.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fedfraud.core.errors import UserError
from fedfraud.serving.config import ConsumerSettings, KafkaSecurity, ProducerSettings

PASSWORD_ENV = "FEDFRAUD_TEST_KAFKA_PASSWORD"


@pytest.fixture
def tls(tmp_path):
    from fedfraud.training.fraud.federated.hist import make_tls_files

    return make_tls_files(tmp_path)


def _sasl_ssl(tls) -> KafkaSecurity:
    return KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="bank-0",
                         sasl_password_env=PASSWORD_ENV, ssl_cafile=str(tls.server_cert),
                         ssl_certfile=str(tls.client_cert), ssl_keyfile=str(tls.client_key))


def test_plaintext_is_the_default_and_says_so():
    assert KafkaSecurity().librdkafka() == {"security.protocol": "plaintext"}


def test_sasl_ssl_in_librdkafkas_vocabulary(tls, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    sec = _sasl_ssl(tls)
    assert sec.librdkafka() == {
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bank-0",
        "sasl.password": "s3cret", "ssl.ca.location": str(tls.server_cert),
        "ssl.certificate.location": str(tls.client_cert), "ssl.key.location": str(tls.client_key)}


def test_the_password_comes_from_the_environment_or_the_command_stops(tls, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(UserError, match=PASSWORD_ENV):
        _sasl_ssl(tls).librdkafka()
    assert [f for f in KafkaSecurity.model_fields if "password" in f] == ["sasl_password_env"]  # names it only


@pytest.mark.parametrize("bad", [
    {"security_protocol": "SASL_SSL"},  # SASL without mechanism and user
    {"security_protocol": "SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"},  # SASL settings on SSL
    {"security_protocol": "SSL", "ssl_certfile": "c.pem"},  # a certificate without its key
    {"security_protocol": "TLS"},  # not a Kafka protocol name
])
def test_inconsistent_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        KafkaSecurity(**bad)


def test_every_client_factory_hands_the_settings_to_librdkafka(tls, monkeypatch):
    """The producer, the ingress consumer, the topic reader and the admin client are built with SASL_SSL and
    mutual TLS; librdkafka loads the certificate files when it builds a client, so a wrong CA path fails here,
    proving the settings arrive."""
    from fedfraud.serving.kafka.broker import _admin
    from fedfraud.serving.kafka import make_consumer, make_producer
    from fedfraud.serving.kafka.consumer import make_reader

    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    sec = _sasl_ssl(tls)
    producer = make_producer("127.0.0.1:1", ProducerSettings(), security=sec)
    producer.close(timeout=0.1)
    consumer = make_consumer("127.0.0.1:1", ConsumerSettings(), "transactions", security=sec)
    consumer.close()
    wrong = sec.model_copy(update={"ssl_cafile": str(tls.server_cert) + ".missing"})
    with pytest.raises(Exception, match="ssl.ca.location|CA|No such file"):
        make_producer("127.0.0.1:1", ProducerSettings(), security=wrong)
    with pytest.raises(Exception, match="ssl.ca.location|CA|No such file"):
        make_reader("127.0.0.1:1", security=wrong)
    with pytest.raises(Exception, match="ssl.ca.location|CA|No such file"):
        _admin("127.0.0.1:1", 1.0, wrong)
    make_reader("127.0.0.1:1", security=sec).close()
    _admin("127.0.0.1:1", 1.0, sec)


def test_readers_and_the_admin_client_get_the_one_mapping(tls, monkeypatch):
    """The topic readers (replay's collect, the label joiner, the console) and the topic admin are configured
    from :meth:`KafkaSecurity.librdkafka`, the same properties as the producer and the ingress consumer."""
    import confluent_kafka
    import confluent_kafka.admin

    from fedfraud.serving.kafka.broker import _admin
    from fedfraud.serving.kafka.consumer import make_reader

    made: list[dict] = []
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda config: made.append(config))
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", lambda config: made.append(config))
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    sec = _sasl_ssl(tls)
    make_reader("127.0.0.1:1", security=sec)
    _admin("127.0.0.1:1", 1.0, sec)
    assert len(made) == 2
    for config in made:
        assert sec.librdkafka().items() <= config.items()
    reader = made[0]
    assert reader["enable.auto.commit"] is False and reader["group.id"].startswith("fedfraud-reader-")
    make_reader("127.0.0.1:1")  # no settings: plaintext, said as librdkafka says it
    assert made[2]["security.protocol"] == "plaintext"
