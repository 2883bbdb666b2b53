/* Preloaded into the torch side of bench_compare.py on AMD processors (LD_PRELOAD).
 *
 * oneMKL, which PyPI's torch uses for its float matrix products, picks its code path by asking
 * whether the processor is Intel's; on an AMD processor with AVX-512 it answers no and runs its
 * AVX2 kernels at about half the rate (measured on the project's AMD EPYC VM: 203-213 GFLOP/s on
 * 2 threads for a medium layer's product shapes, 463-482 with this shim, where the gemm crate on
 * our side runs at 379-468). Answering yes lets MKL use the AVX-512 kernels the processor has, so
 * that HF's side is measured at its best. libtorch_cpu exports these symbols, so a preloaded
 * definition takes their place. */
int mkl_serv_intel_cpu_true(void) { return 1; }
