# The compose stack's connection pooler: Debian bookworm's PgBouncer 1.18, the very package
# the tests run against (.ci/run installs it; tests/integration/test_pgbouncer_compose.py),
# configured from the environment by pgbouncer-entrypoint.sh (docs/deploy.md, "Sizing").
#
#   docker build -f docker/pgbouncer.Dockerfile -t regen-pgbouncer .
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}

# pgbouncer=1.18.*: bookworm's security updates, never a silent move to another release the
# tests did not run. postgresql-client: psql and pg_isready for the healthcheck and for
# `SHOW POOLS` on the admin console.
RUN apt-get update \
 && apt-get install -y --no-install-recommends "pgbouncer=1.18.*" postgresql-client \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /etc/pgbouncer && chown postgres:postgres /etc/pgbouncer

COPY docker/pgbouncer-entrypoint.sh /usr/local/bin/pgbouncer-entrypoint.sh

# PgBouncer refuses to run as root; the package's own `postgres` user runs it.
USER postgres
EXPOSE 6432
ENTRYPOINT ["/usr/local/bin/pgbouncer-entrypoint.sh"]
