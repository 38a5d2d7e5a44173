# The agent image: vk-provider runs as a pod in the cluster whose virtual node it serves.
#
# Pinned: the base image by digest (python:3.11-slim, the multi-platform index; provenance and
# how to update it: docs/deploying.md#the-image), every Python dependency by version and hash
# (requirements.lock, from scripts/lock; pip refuses anything unhashed), and the build backend
# is the base image's own setuptools (no build isolation: nothing unpinned is downloaded).
# tests/unit/test_image.py checks this file, the lock file and pyproject.toml agree.
#
# Runs as a non-root user and writes nowhere but its state directory (/var/lib/vk-provider, a
# volume) and /tmp (an emptyDir in the chart), so readOnlyRootFilesystem: true holds.
ARG BASE=python:3.11-slim@sha256:90744cff8f32887f075c47d747a173ff333e9e98801667af93c357fa9f5e28ff

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements.lock ./
RUN pip install --require-hashes --only-binary=:all: --prefix=/install -r requirements.lock
COPY pyproject.toml README.md ./
COPY vk_provider ./vk_provider
COPY providers ./providers
RUN pip install --no-deps --no-build-isolation --prefix=/install .

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VK_PROVIDER_STATE_DIR=/var/lib/vk-provider \
    HOME=/tmp
COPY --from=build /install /usr/local
# Compile the bytecode now: at run time the root filesystem is read-only.
RUN python -m compileall -q /usr/local/lib/python3.11/site-packages \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin vk \
    && mkdir -p /var/lib/vk-provider && chown 65532:65532 /var/lib/vk-provider
USER 65532:65532
VOLUME ["/var/lib/vk-provider"]
ENTRYPOINT ["vk-provider"]
CMD ["--help"]
