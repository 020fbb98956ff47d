#!/usr/bin/env bash
# One command per benchmark, on a fresh machine too: sets up what the part needs, runs
# it, and it writes its table (Markdown), JSON and plot into bench/results/.
#
#   bash scripts/bench.sh PART [--quick] [--broker tansu|kafka] [more options of the script]
#
# PART: slow | cpu | filter | amplification | churn | all   (bench.throughput)
#       peers          keyshard vs share group, KIP-848 group, Pyrallel, plain group
#                      (bench.peers; on Apache Kafka unless --broker tansu)
#       handoff        bench.handoff_pause         coord-scale    bench.coord_scale
#       balance        bench.balance               spark          bench.spark_source
#       filter-breakdown   bench.filter_breakdown
#       ab --base REV      this checkout's no-op path against REV's, alternating (bench.ab)
#       lane-cost --base REV   instructions per record of the data path against REV's,
#                          counted by valgrind (bench.lane_cost)
#       failover       bench.failover              exactly-once   bench.exactly_once
#       sigterm-handoff    bench.sigterm_handoff
#       memory         peak RSS of two consumers on a 200 MB..2 GB backlog (bench.memory;
#                      on Apache Kafka unless --broker tansu)
#       kafka-failover     a rolling restart and a crash of a 3-node Apache Kafka cluster,
#                          keyshard beside a KIP-848 group (bench.kafka_failover)
#       skewed-backlog     keyshard vs share group, KIP-848 group on a skewed backlog
#                          (bench.skewed_backlog; on Apache Kafka unless --broker tansu)
#
# What it sets up (each step idempotent, cached):
# - the project's .venv with keyshard[bench] (server, spark, matplotlib);
# - each peer in a virtualenv of its own under the project's cache
#   ($KEYSHARD_CACHE, default ~/.cache/keyshard): peers/pyrallel (Pyrallel Consumer 1.0.0,
#   which declares Python >= 3.12 but runs on 3.11) and peers/confluent (confluent-kafka
#   2.16.1: the KIP-848 consumer and the share consumer);
# - for --broker kafka, Apache Kafka's jars from Maven Central, as the tests' broker
#   (harness/brokers/kafka.py) collects them; Java 17 and Maven from Debian if missing;
# - for spark, Spark's own Kafka source (spark-sql-kafka-0-10, the baseline) and its
#   dependencies from Maven Central the same way (bench/spark-kafka-pom.xml).
# Each benchmark runs as a module from the repository root: `python -m bench.NAME ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2
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
  slow|cpu|filter|amplification|churn|all) module=bench.throughput; args=("$part" "${args[@]}"); peers=1 ;;
  peers) module=bench.peers; peers=1; broker="${broker:-kafka}" ;;
  handoff) module=bench.handoff_pause; peers=1 ;;
  coord-scale) module=bench.coord_scale; peers=0 ;;
  ab) module=bench.ab; peers=0 ;;
  lane-cost) module=bench.lane_cost; peers=0 ;;
  balance) module=bench.balance; peers=0 ;;
  spark) module=bench.spark_source; peers=0; spark_kafka=1 ;;
  filter-breakdown) module=bench.filter_breakdown; peers=0 ;;
  failover) module=bench.failover; peers=0 ;;
  exactly-once) module=bench.exactly_once; peers=0; broker=kafka ;;  # needs transactions
  sigterm-handoff) module=bench.sigterm_handoff; peers=0 ;;
  memory) module=bench.memory; peers=0; broker="${broker:-kafka}" ;;
  kafka-failover) module=bench.kafka_failover; peers=1; broker=kafka ;;  # a 3-node cluster
  skewed-backlog) module=bench.skewed_backlog; peers=1; broker="${broker:-kafka}" ;;
  *) echo "unknown part '$part' (see: bash scripts/bench.sh)" >&2; exit 2 ;;
esac
case "$module:$broker" in
  *:|*:tansu|bench.throughput:kafka|bench.peers:kafka|bench.handoff_pause:kafka) ;;
  bench.failover:kafka|bench.exactly_once:kafka|bench.spark_source:kafka) ;;
  bench.skewed_backlog:kafka|bench.kafka_failover:kafka|bench.memory:kafka) ;;
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
if [ "$part" = lane-cost ] && ! command -v valgrind >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq valgrind
fi
if [ "$broker" = kafka ]; then
  .venv/bin/python -c 'from harness.brokers.kafka import ensure_jars; print("Apache Kafka jars:", ensure_jars())'
fi
if [ "$spark_kafka" = 1 ]; then
  .venv/bin/python -m bench._spark_kafka
fi
exec .venv/bin/python -m "$module" "${args[@]}"
