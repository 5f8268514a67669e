# The Flower SuperLink and SuperNode images (infra/k8s/flower.yaml) with fedfraud's dependencies baked in.
# `flwr run` ships the app's code (a FAB) to the SuperLink and the SuperNodes, but not its dependencies: the
# ServerApp runs beside the SuperLink and each ClientApp beside its SuperNode (Flower's default subprocess
# isolation), so both images need torch, torch-geometric, xgboost and the fedfraud packages installed.
# Not built in this repository's CI (no container runtime there): see docs/deploy.md.
#
#   docker build -f infra/docker/flower.Dockerfile --build-arg COMPONENT=superlink -t registry.example.com/fedfraud-superlink:0.1.0 .
#   docker build -f infra/docker/flower.Dockerfile --build-arg COMPONENT=supernode -t registry.example.com/fedfraud-supernode:0.1.0 .
#
# Those two tags are what infra/k8s/flower.yaml names (the SuperLink, the key-registration Job, the SuperNode); none
# uses `latest`. Pods run them as uid 49999 (user app of Flower's base image) with a read-only root filesystem
# and FLWR_HOME on an emptyDir.
ARG COMPONENT=supernode

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

# flwr/superlink and flwr/supernode 1.41.0 carry flwr 1.41.0, the version pyproject.toml pins, on Python 3.11.
FROM flwr/${COMPONENT}:1.41.0
ARG TORCH_INDEX_URL=""
COPY --from=wheel /wheels /tmp/wheels
RUN python -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0 \
 && python -m pip install --no-cache-dir /tmp/wheels/*.whl \
 && python -c "import fedfraud, fedfraud.training.anomaly.federated.client_app, fedfraud.training.anomaly.federated.server_app; import flwr; assert flwr.__version__ == '1.41.0'" \
 && rm -rf /tmp/wheels
# numeric, so that Kubernetes can check runAsNonRoot against the image itself (user app of flwr/base)
USER 49999
