/* SPDX-License-Identifier: MIT */
/*
 * Element-wise reductions of the emulated NCCL, for the ncclDataType_t and ncclRedOp_t values
 * of nccl.h: integers, float16, bfloat16, float32, float64 with sum, prod, max, min and avg.
 * The two 8-bit float formats and ncclRedOpCreatePreMulSum operators are not emulated; the
 * callers reject them with ncclInvalidArgument. Half-precision values are widened to float,
 * combined and rounded back (to nearest, ties to even) at every step, as a device kernel that
 * reduces in float and stores halves does.
 */
#include <math.h>
#include <string.h>

#include "nccl-internal.h"

size_t nccl_type_size(ncclDataType_t type)
{
	switch (type) {
	case ncclInt8:
	case ncclUint8:
		return 1;
	case ncclFloat16:
	case ncclBfloat16:
		return 2;
	case ncclInt32:
	case ncclUint32:
	case ncclFloat32:
		return 4;
	case ncclInt64:
	case ncclUint64:
	case ncclFloat64:
		return 8;
	default:
		return 0;
	}
}

bool nccl_op_valid(ncclRedOp_t op)
{
	return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin || op == ncclAvg;
}

static float bits_to_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t float_to_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bf16_to_float(uint16_t h)
{
	return bits_to_float((uint32_t)h << 16);
}

static uint16_t float_to_bf16(float f)
{
	uint32_t u = float_to_bits(f);

	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40); /* stay a (quiet) NaN */
	u += 0x7fff + ((u >> 16) & 1);		     /* round to nearest, ties to even */
	return (uint16_t)(u >> 16);
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f) /* inf, NaN */
		return bits_to_float(sign | 0x7f800000 | (man << 13));
	if (exp == 0) { /* zero, subnormal: man * 2^-24 */
		float f = ldexpf((float)man, -24);
		return sign ? -f : f;
	}
	return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

static uint16_t float_to_half(float f)
{
	uint32_t u = float_to_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	float a = fabsf(f);

	if (isnan(f))
		return sign | 0x7e00;
	if (a >= 65520.0f) /* rounds past the largest half, 65504 */
		return sign | 0x7c00;
	if (a < 6.103515625e-05f) { /* subnormal range: units of 2^-24, rounded to even */
		float q = rintf(ldexpf(a, 24));
		return sign | (uint16_t)q; /* q == 1024 is exactly the smallest normal */
	}
	/* Normal: drop 13 mantissa bits with round to nearest even; a carry bumps the exponent,
	 * which is the correct result. */
	u = float_to_bits(a);
	u += 0xfff + ((u >> 13) & 1);
	return sign | (uint16_t)(((u >> 23) - 112) << 10 | ((u >> 13) & 0x3ff));
}

#define COMBINE(a, b, op)                            \
	((op) == ncclProd  ? (a) * (b)               \
	 : (op) == ncclMax ? ((a) > (b) ? (a) : (b)) \
	 : (op) == ncclMin ? ((a) < (b) ? (a) : (b)) \
			   : (a) + (b)) /* ncclSum, and ncclAvg before its division */

/* Integers wrap as the device's unsigned arithmetic does; signed ones go through unsigned for
 * sum and prod so that overflow is defined here too. */
#define REDUCE_INT(T, UT)                                        \
	do {                                                     \
		T *x = acc;                                      \
		const T *y = in;                                 \
		for (size_t i = 0; i < n; i++) {                 \
			T a, b;                                  \
			memcpy(&a, &x[i], sizeof(T));            \
			memcpy(&b, &y[i], sizeof(T));            \
			if (op == ncclProd)                      \
				a = (T)((UT)a * (UT)b);          \
			else if (op == ncclMax || op == ncclMin) \
				a = COMBINE(a, b, op);           \
			else                                     \
				a = (T)((UT)a + (UT)b);          \
			memcpy(&x[i], &a, sizeof(T));            \
		}                                                \
	} while (0)

#define REDUCE_FLOAT(T)                               \
	do {                                          \
		T *x = acc;                           \
		const T *y = in;                      \
		for (size_t i = 0; i < n; i++) {      \
			T a, b;                       \
			memcpy(&a, &x[i], sizeof(T)); \
			memcpy(&b, &y[i], sizeof(T)); \
			a = COMBINE(a, b, op);        \
			memcpy(&x[i], &a, sizeof(T)); \
		}                                     \
	} while (0)

#define REDUCE_HALF(to_float, from_float)                   \
	do {                                                \
		uint16_t *x = acc;                          \
		const uint16_t *y = in;                     \
		for (size_t i = 0; i < n; i++) {            \
			uint16_t hx, hy;                    \
			float a, b;                         \
			memcpy(&hx, &x[i], 2);              \
			memcpy(&hy, &y[i], 2);              \
			a = to_float(hx);                   \
			b = to_float(hy);                   \
			hx = from_float(COMBINE(a, b, op)); \
			memcpy(&x[i], &hx, 2);              \
		}                                           \
	} while (0)

void nccl_reduce(void *acc, const void *in, size_t n, ncclDataType_t type, ncclRedOp_t op)
{
	switch (type) {
	case ncclInt8:
		REDUCE_INT(int8_t, uint8_t);
		break;
	case ncclUint8:
		REDUCE_INT(uint8_t, uint8_t);
		break;
	case ncclInt32:
		REDUCE_INT(int32_t, uint32_t);
		break;
	case ncclUint32:
		REDUCE_INT(uint32_t, uint32_t);
		break;
	case ncclInt64:
		REDUCE_INT(int64_t, uint64_t);
		break;
	case ncclUint64:
		REDUCE_INT(uint64_t, uint64_t);
		break;
	case ncclFloat16:
		REDUCE_HALF(half_to_float, float_to_half);
		break;
	case ncclBfloat16:
		REDUCE_HALF(bf16_to_float, float_to_bf16);
		break;
	case ncclFloat32:
		REDUCE_FLOAT(float);
		break;
	case ncclFloat64:
		REDUCE_FLOAT(double);
		break;
	default:
		break;
	}
}

#define DIVIDE(T)                                     \
	do {                                          \
		T *x = acc;                           \
		for (size_t i = 0; i < n; i++) {      \
			T a;                          \
			memcpy(&a, &x[i], sizeof(T)); \
			a = (T)(a / (T)nranks);       \
			memcpy(&x[i], &a, sizeof(T)); \
		}                                     \
	} while (0)

#define DIVIDE_HALF(to_float, from_float)                            \
	do {                                                         \
		uint16_t *x = acc;                                   \
		for (size_t i = 0; i < n; i++) {                     \
			uint16_t h;                                  \
			memcpy(&h, &x[i], 2);                        \
			h = from_float(to_float(h) / (float)nranks); \
			memcpy(&x[i], &h, 2);                        \
		}                                                    \
	} while (0)

/* ncclAvg: "sum, then divide by the number of ranks"; integers divide with truncation. */
void nccl_reduce_avg_finish(void *acc, size_t n, ncclDataType_t type, int nranks)
{
	switch (type) {
	case ncclInt8:
		DIVIDE(int8_t);
		break;
	case ncclUint8:
		DIVIDE(uint8_t);
		break;
	case ncclInt32:
		DIVIDE(int32_t);
		break;
	case ncclUint32:
		DIVIDE(uint32_t);
		break;
	case ncclInt64:
		DIVIDE(int64_t);
		break;
	case ncclUint64:
		DIVIDE(uint64_t);
		break;
	case ncclFloat16:
		DIVIDE_HALF(half_to_float, float_to_half);
		break;
	case ncclBfloat16:
		DIVIDE_HALF(bf16_to_float, float_to_bf16);
		break;
	case ncclFloat32:
		DIVIDE(float);
		break;
	case ncclFloat64:
		DIVIDE(double);
		break;
	default:
		break;
	}
}
