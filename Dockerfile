# A container image of tlsterm: built on Debian 12 with the same toolchain as the README's
# commands, run as an unprivileged user from a slim image.
#
#   docker build -t tlsterm .
#   docker run --rm -p 8443:8443 tlsterm                       # embedded default, try it
#   docker run --rm -p 443:8443 -v /etc/tlsterm:/etc/tlsterm:ro tlsterm \
#       serve -c /etc/tlsterm/tlsterm.toml                     # your configuration
#
# The embedded default listens on 127.0.0.1; the image's default command listens on
# 0.0.0.0:8443 instead (packaging/container.toml) so that a published port reaches it.
# Reload with `docker kill --signal HUP`; `docker stop` drains (SIGTERM).
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq cmake clang libclang-dev >/dev/null
WORKDIR /src
COPY . .
# Without the debug information and symbols the release profile keeps for profiling:
# a 146 MB binary becomes 22 MB.
RUN CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked -p tlsterm

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home-dir /var/lib/tlsterm --create-home tlsterm
COPY --from=build /src/target/release/tlsterm /usr/bin/tlsterm
COPY packaging/container.toml /etc/tlsterm/tlsterm.toml
USER tlsterm
EXPOSE 8443
ENTRYPOINT ["/usr/bin/tlsterm"]
CMD ["serve", "-c", "/etc/tlsterm/tlsterm.toml"]
