"""Low-precision GEMMs and GEMVs for CPUs: bf16/f16/int8 micro-kernels as registry rows around
one driver, AMX tiles, and the weight-only kernels (int4/fp4/int8/fp8 codes with group scales)."""
