#!/bin/sh
# SPDX-License-Identifier: MIT
# coldstart.sh: cold-start phase timings of the engine stand-in on the emulated GPU for weights
# of several sizes (default 256M 1G 4G). Weights files go to a temporary directory that is
# removed on exit; one size at a time, so at most one file exists at once.
#
#   tests/engine/coldstart.sh [-B BUILD_DIR] [--sizes "256M 1G 4G"] [--tp N] [--shim]
#                             [--load-format auto|dummy] [--drop-caches]
#
# --shim runs the engine under LD_PRELOAD=libbelayer.so (no supervisor: pass-through mode);
# --drop-caches drops the page cache before each start (root), so the load reads the disk.
set -eu

build=""
sizes="256M 1G 4G"
tp=1
shim=0
format=auto
drop=0
while [ $# -gt 0 ]; do
	case "$1" in
	-B) build="$2"; shift 2 ;;
	--sizes) sizes="$2"; shift 2 ;;
	--tp) tp="$2"; shift 2 ;;
	--shim) shim=1; shift ;;
	--load-format) format="$2"; shift 2 ;;
	--drop-caches) drop=1; shift ;;
	-h|--help) sed -n '3,12p' "$0"; exit 0 ;;
	*) echo "coldstart.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
if [ -z "$build" ]; then
	for d in build /tmp/build-engine; do
		if [ -x "$d/tests/engine/belayer-test-engine" ]; then build="$d"; break; fi
	done
fi
engine="$build/tests/engine/belayer-test-engine"
gen="$build/tests/engine/gen-weights"
if [ ! -x "$engine" ] || [ ! -x "$gen" ]; then
	echo "coldstart.sh: build first (meson setup BUILD && ninja -C BUILD), then pass -B BUILD" >&2
	exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/belayer-coldstart.XXXXXX")
pid=""
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

mkdir "$tmp/emu"
export LD_LIBRARY_PATH="$build/tests/emu"
export BELAYER_EMU_KERNELS="$build/tests/engine/libengine-kernels-host.so"
export BELAYER_EMU_DIR="$tmp/emu"
export BELAYER_EMU_DEVICES="${BELAYER_EMU_DEVICES:-$((tp > 2 ? tp : 2))}"
# device memory is host memory here (memfd): room for the largest weights plus the KV cache
export BELAYER_EMU_MEM="${BELAYER_EMU_MEM:-10G}"
preload=""
if [ "$shim" = 1 ]; then preload="$build/shim/libbelayer.so"; fi

printf '%-6s %-8s %8s %8s %9s %9s %8s %8s %8s\n' size gen_s cuda_s nccl_s weights_s kv_s \
	warmup_s serve_s total_s
for size in $sizes; do
	w="$tmp/weights-$size.safetensors"
	t0=$(date +%s.%N)
	"$gen" --out "$w" --size "$size" --seed 1 --hidden 128 --heads 4 --ffn 512 --layers 4 \
		--vocab 4096 --max-pos 1024 >/dev/null
	t1=$(date +%s.%N)
	if [ "$drop" = 1 ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi
	rm -f "$tmp/ready"
	LD_PRELOAD="$preload" "$engine" --model "$w" --port 0 --tp "$tp" --load-format "$format" \
		--kv-cache-bytes 256M >"$tmp/ready" 2>"$tmp/log" &
	pid=$!
	i=0
	while [ ! -s "$tmp/ready" ]; do
		if ! kill -0 "$pid" 2>/dev/null || [ $i -ge 3000 ]; then
			cat "$tmp/log" >&2
			echo "coldstart.sh: engine did not become ready for $size" >&2
			exit 1
		fi
		sleep 0.1
		i=$((i + 1))
	done
	# the ready line: {"event":"ready",...,"phases":{"cuda_init_s":X,...},"total_s":Y}
	line=$(head -n 1 "$tmp/ready")
	field() { printf '%s' "$line" | sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
	printf '%-6s %-8.2f %8s %8s %9s %9s %8s %8s %8s\n' "$size" \
		"$(awk "BEGIN { print $t1 - $t0 }")" "$(field cuda_init_s)" "$(field nccl_init_s)" \
		"$(field weights_load_s)" "$(field kv_alloc_s)" "$(field warmup_s)" \
		"$(field serve_s)" "$(field total_s)"
	kill "$pid"
	wait "$pid" || true
	pid=""
	rm -f "$w"
done
