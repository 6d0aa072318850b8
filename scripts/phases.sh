#!/usr/bin/env bash
# `make test`'s phases in order, each given as NAME=COMMAND, stopping at the first that fails; at the
# end, the wall time of each phase that ran, so that a slow phase shows in CI's log (and
# scripts/first_hour.py records them). Exits with the failing phase's status, else 0.
set -u
names=()
seconds=()
status=0
for phase in "$@"; do
	name=${phase%%=*}
	start=$(date +%s)
	bash -c "${phase#*=}"
	status=$?
	names+=("$name")
	seconds+=($(($(date +%s) - start)))
	[ "$status" -eq 0 ] || break
done
echo "---- make test: wall time per phase ----"
total=0
for i in "${!names[@]}"; do
	s=${seconds[$i]}
	total=$((total + s))
	printf 'make test phase %s: %d s (%d min %d s)\n' "${names[$i]}" "$s" $((s / 60)) $((s % 60))
done
printf 'make test phases in all: %d s (%d min %d s)\n' "$total" $((total / 60)) $((total % 60))
[ "$status" -eq 0 ] || echo "make test: phase ${names[-1]} failed (exit $status)"
exit "$status"
