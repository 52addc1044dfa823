#!/bin/sh
# SPDX-License-Identifier: MIT
# ptx-index.sh KERNELS.h OUT.ptx: without nvcc, a PTX text that only declares the entries
# listed in ENGINE_KERNELS. The emulated driver binds entries by name, so tests run; a real
# driver rejects it (build with nvcc for a GPU). meson says so when it falls back to this.
set -eu
{
	echo '// Entry index for the emulated driver only: nvcc was not found at build time.'
	echo '.version 8.0'
	echo '.target sm_90'
	echo '.address_size 64'
	sed -n 's/^[[:space:]]*X(\(engine_[a-z_]*\),.*/\1/p' "$1" | while read -r name; do
		printf '.visible .entry %s(\n\t.param .align 8 .b8 %s_param_0[8]\n)\n{\n\tret;\n}\n' \
			"$name" "$name"
	done
} >"$2"
