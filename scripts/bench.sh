#!/usr/bin/env bash
# One command per benchmark, on a fresh machine too: sets up what the part needs, runs
# it, and it writes its table (Markdown), JSON and plot into bench/results/.
#
#   bash scripts/bench.sh PART [--quick] [--broker tansu|kafka] [more options of the script]
#
# PART: slow | cpu | filter | amplification | churn | all   (bench/throughput.py)
#       peers          keyshard vs share group, KIP-848 group, Pyrallel, plain group
#                      (bench/peers.py; on Apache Kafka unless --broker tansu)
#       handoff        bench/handoff_pause.py      coord-scale    bench/coord_scale.py
#       balance        bench/balance.py            spark          bench/spark_source.py
#       filter-breakdown   bench/filter_breakdown.py
#       failover       bench/failover.py           exactly-once   bench/exactly_once.py
#       sigterm-handoff    bench/sigterm_handoff.py
#       skewed-backlog     keyshard vs share group, KIP-848 group on a skewed backlog
#                          (bench/skewed_backlog.py; on Apache Kafka unless --broker tansu)
#
# What it sets up (each step idempotent, cached):
# - the project's .venv with keyshard[bench] (server, spark, matplotlib);
# - each peer in a virtualenv of its own under the project's cache
#   ($KEYSHARD_CACHE, default ~/.cache/keyshard): peers/pyrallel (Pyrallel Consumer 1.0.0,
#   which declares Python >= 3.12 but runs on 3.11) and peers/confluent (confluent-kafka
#   2.16.1: the KIP-848 consumer and the share consumer);
# - for --broker kafka, Apache Kafka's jars from Maven Central, as the test fixture
#   (tests/brokers/kafka.py) collects them; Java 17 and Maven from Debian if missing;
# - for spark, Spark's own Kafka source (spark-sql-kafka-0-10, the baseline) and its
#   dependencies from Maven Central the same way (bench/spark-kafka-pom.xml).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
part="$1"
shift
broker=""
spark_kafka=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --broker) broker="$2"; args+=("$1" "$2"); shift 2 ;;
    --broker=*) broker="${1#--broker=}"; args+=("$1"); shift ;;
    *) args+=("$1"); shift ;;
  esac
done

case "$part" in
  slow|cpu|filter|amplification|churn|all) script=bench/throughput.py; args=("$part" "${args[@]}"); peers=1 ;;
  peers) script=bench/peers.py; peers=1; broker="${broker:-kafka}" ;;
  handoff) script=bench/handoff_pause.py; peers=1 ;;
  coord-scale) script=bench/coord_scale.py; peers=0 ;;
  balance) script=bench/balance.py; peers=0 ;;
  spark) script=bench/spark_source.py; peers=0; spark_kafka=1 ;;
  filter-breakdown) script=bench/filter_breakdown.py; peers=0 ;;
  failover) script=bench/failover.py; peers=0 ;;
  exactly-once) script=bench/exactly_once.py; peers=0; broker=kafka ;;  # needs transactions
  sigterm-handoff) script=bench/sigterm_handoff.py; peers=0 ;;
  skewed-backlog) script=bench/skewed_backlog.py; peers=1; broker="${broker:-kafka}" ;;
  *) echo "unknown part '$part' (see: bash scripts/bench.sh)" >&2; exit 2 ;;
esac
case "$script:$broker" in
  *:|*:tansu|bench/throughput.py:kafka|bench/peers.py:kafka|bench/handoff_pause.py:kafka) ;;
  bench/failover.py:kafka|bench/exactly_once.py:kafka|bench/spark_source.py:kafka) ;;
  bench/skewed_backlog.py:kafka) ;;
  *) echo "$part has no --broker $broker (on Kafka: the throughput parts, peers, handoff, failover, spark, skewed-backlog)" >&2; exit 2 ;;
esac

bash scripts/setup.sh bench

cache="${KEYSHARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keyshard}"
python_bin="${PYTHON:-$(command -v python3.11 || command -v python3)}"
peer_venv() {  # name, then pip arguments; reinstalled only when they change
  local dir="$cache/peers/$1"
  shift
  local want="$*"
  if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$want" ]; then
    echo "installing $want into $dir (log: $dir.log)"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    if ! { "$python_bin" -m venv "$dir" && "$dir/bin/python" -m pip install -q "$@"; } \
        > "$dir.log" 2>&1; then
      tail -n 20 "$dir.log" >&2
      echo "could not install $want: see $dir.log" >&2
      exit 1
    fi
    echo "$want" > "$dir/.installed"
  fi
}
if [ "$peers" = 1 ]; then
  # Pyrallel declares Python >= 3.12; it runs on 3.11, which keyshard needs.
  peer_venv pyrallel --ignore-requires-python pyrallel-consumer==1.0.0
  peer_venv confluent confluent-kafka==2.16.1
fi
if [ "$broker" = kafka ] || [ "$spark_kafka" = 1 ]; then
  if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless maven
    fi
  fi
fi
if [ "$broker" = kafka ]; then
  .venv/bin/python -c 'from tests.brokers.kafka import ensure_jars; print("Apache Kafka jars:", ensure_jars())'
fi
if [ "$spark_kafka" = 1 ]; then
  PYTHONPATH=. .venv/bin/python bench/_spark_kafka.py
fi
# The scripts import the test fixtures (tests.brokers, tests.integration.harness) too.
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python "$script" "${args[@]}"
