# The fedfraud image: Ray head and workers of the RayService (serving), the retraining CronJob, the features Job
# and the label joiner (infra/k8s). Every dependency is installed here, at build time; pods only start the code.
# Not built in this repository's CI (no container runtime there): see docs/deploy.md.
#
#   docker build -f infra/docker/fedfraud.Dockerfile -t registry.example.com/fedfraud:0.1.0 .
#
# That tag (the version in pyproject.toml) is what every manifest names; none uses `latest`. Pods run it as
# uid 1000 / gid 100 (user ray) with a read-only root filesystem: Ray's /tmp and /work are emptyDir volumes there.
#
# Torch: the exact pin of the Makefile. For a CPU-only image (the default target) point pip at PyTorch's CPU
# wheel index with --build-arg TORCH_INDEX_URL=...; without it pip takes the default (CUDA) wheel.
ARG RAY_IMAGE=rayproject/ray:2.55.1-py311-cpu

FROM python:3.11.13-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY fedfraud ./fedfraud
COPY feature_store ./feature_store
COPY config ./config
COPY core ./core
COPY training ./training
COPY serving ./serving
RUN python -m pip wheel --no-cache-dir --no-deps -w /wheels .

FROM ${RAY_IMAGE}
ARG TORCH_INDEX_URL=""
COPY --from=wheel /wheels /tmp/wheels
RUN python -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0 \
 && python -m pip install --no-cache-dir /tmp/wheels/*.whl \
 && python -c "import fedfraud, fedfraud.serving.app, feast, psycopg, ray.serve" \
 && rm -rf /tmp/wheels
# Ray's image runs as user ray; the Feast repo is rendered into this folder at start-up (features.repo_dir).
WORKDIR /work
ENV PYTHONUNBUFFERED=1
# numeric, so that Kubernetes can check runAsNonRoot against the image itself (user ray of rayproject/ray)
USER 1000:100
