# syntax=docker/dockerfile:1
# Sandgate's image: a static binary built by `make build` (the same flags as every other build,
# checked by test/deploy) on a distroless, non-root runtime. Base images are pinned by version;
# pin them by digest too in your registry mirror (`docker buildx imagetools inspect`).
ARG GO_IMAGE=golang:1.26.8-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make build VERSION=${VERSION} && ./bin/sandgate version

FROM ${RUNTIME_IMAGE}
COPY --from=build /src/bin/sandgate /usr/local/bin/sandgate
COPY --from=build /src/policies /etc/sandgate/policies
# 65532 is distroless's nonroot user; the chart also sets runAsNonRoot and a read-only root.
USER 65532:65532
EXPOSE 8080 3128 9090
ENTRYPOINT ["/usr/local/bin/sandgate"]
CMD ["serve", "--config", "/etc/sandgate/sandgate.yaml"]
