# The agent image: vk-provider runs as a pod in the cluster whose virtual node it serves.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY vk_provider ./vk_provider
COPY providers ./providers
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin vk
USER 65532
ENTRYPOINT ["vk-provider"]
CMD ["--help"]
