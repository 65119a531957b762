#!/usr/bin/env bash
# callgrind.sh: the instructions redis-server spends per call of our
# scripts, counted by valgrind's callgrind (steady within 1% from run to
# run, where timings on a shared machine move by 10-30%). Each case is
# 300 calls by redis-benchmark to warm, then N (default 2000) counted
# between callgrind_control -z and -d. Kernel time (the syscalls of a
# request) is not counted: it weighs on a request, not on a key, so it
# favours the coalesced calls, and PING's line shows what a request costs
# Redis in user space.
#
# Cases: a lone AllowN of window.Redis (its short form) and of the script
# before reservations (window/testdata), on one key; a flush of 8 plain
# keys of window.Redis and of bucket.Redis, in the whole form and in the
# compact form flushes of one-unit requests take, the keys drawn from
# 1,000 per place; a flush of 8 one-unit requests on one key of
# window.Redis (a hot key's), whole and compact; a lone AllowN of
# bucket.Redis on 1,000 keys (its head's path); go-redis/redis_rate's
# allowN on 1,000 keys (its script read from the module cache: run `go
# mod download` in bench/ first). Needs valgrind, redis-server and
# redis-benchmark on PATH. Run from bench/:
#
#	./callgrind.sh
set -euo pipefail
cd "$(dirname "$0")"
N=${N:-2000}
PORT=${PORT:-6419}
work=$(mktemp -d)
trap 'redis-cli -p $PORT shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

cat ../window/window_head.lua ../window/units.lua ../window/plain.lua \
	../internal/redisscript/grouped.lua ../window/window.lua >"$work/window.lua"
cat ../bucket/bucket_head.lua ../bucket/convert.lua ../bucket/bucket.lua >"$work/bucket.lua"
rate=$(go list -m -f '{{.Dir}}' github.com/go-redis/redis_rate/v10)/lua.go
awk '/^var allowN = redis.NewScript\(`/{on=1; next} on && /^`\)/{exit} on' "$rate" >"$work/redis_rate.lua"

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
	redis-server --port "$PORT" --save '' --appendonly no >"$work/valgrind.log" 2>&1 &
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
pid=$(redis-cli -p "$PORT" info server | awk -F: '/^process_id/{print $2}' | tr -d '\r')
load() { redis-cli -p "$PORT" script load "$(cat "$1")"; }
window=$(load "$work/window.lua")
before=$(load ../window/testdata/window_before_reservations.lua)
bucket=$(load "$work/bucket.lua")
redisRate=$(load "$work/redis_rate.lua")

measure() { # name, then the command
	local name=$1
	shift
	redis-benchmark -p "$PORT" -c 1 -n 300 -r 1000 "$@" >/dev/null
	callgrind_control -z "$pid" >/dev/null 2>&1
	redis-benchmark -p "$PORT" -c 1 -n "$N" -r 1000 "$@" >/dev/null
	callgrind_control -d "$pid" >/dev/null 2>&1
	sleep 0.3
	local ir
	ir=$(grep -h -m1 '^summary:\|^totals:' "$(ls -t "$work"/cg.out.* | head -1)" | awk '{print $2}')
	printf '%-34s %8d instructions a call\n' "$name" $((ir / N))
}

measure "PING" ping
measure "window, lone AllowN" evalsha "$window" 3 "{l}" "{l}:s" "{l}:p" "" 1000000 1000000000 0 m__rand_int__
measure "before reservations, lone AllowN" evalsha "$before" 1 "{b}" 1000000 1000000000 1000 1 m__rand_int__
keys="" args=""
for k in 1 2 3 4 5 6 7 8; do
	keys="$keys {w$k:__rand_int__} {w$k:__rand_int__}:s {w$k:__rand_int__}:p"
	args="$args 1000000 1000000000 0 1 1 m__rand_int__ -1"
done
# shellcheck disable=SC2086 # the keys and arguments are words
measure "window, 8 plain keys (whole form)" evalsha "$window" 24 $keys "" 0 "" $args
args=""
for k in 1 2 3 4 5 6 7 8; do
	args="$args 0 m__rand_int__"
done
# shellcheck disable=SC2086
measure "window, 8 plain keys (compact)" evalsha "$window" 24 $keys "" p "" 1000000 1000000000 $args
args="" members=""
for k in 1 2 3 4 5 6 7 8; do
	args="$args 1 m${k}__rand_int__ -1"
	members="$members m${k}__rand_int__"
done
# shellcheck disable=SC2086
measure "window, 8 on one key (whole form)" evalsha "$window" 3 "{h}" "{h}:s" "{h}:p" "" 0 "" 1000000 1000000000 0 8 $args
# shellcheck disable=SC2086
measure "window, 8 on one key (compact)" evalsha "$window" 3 "{g}" "{g}:s" "{g}:p" "" q "" 1000000 1000000000 0 8 $members
keys="" pauses="" args=""
for k in 1 2 3 4 5 6 7 8; do
	keys="$keys {t$k:__rand_int__}"
	pauses="$pauses {t$k:__rand_int__}:p"
	args="$args 0 1 1"
done
# shellcheck disable=SC2086
measure "bucket, 8 keys (whole form)" evalsha "$bucket" 16 $keys $pauses "" 1 60000000 1 600000000000000 $args
# shellcheck disable=SC2086
measure "bucket, 8 keys (compact)" evalsha "$bucket" 16 $keys $pauses "" -1 60000000 1 600000000000000 0 0 0 0 0 0 0 0
measure "bucket, lone AllowN" evalsha "$bucket" 2 "{o:__rand_int__}" "{o:__rand_int__}:p" "" 1 60000000 1 600000000000000 0 1 1
measure "redis_rate, one key" evalsha "$redisRate" 1 "{r:__rand_int__}" 10000000 1 60 1
