/* AMX tiles for the kernels that use them (int4_rows.c, bf16_tiles.c): whether this process may
 * use them, and one configuration for all of them, 8 tiles of 16 rows x 64 bytes. */
#ifndef QUICKDRAFT_AMX_H
#define QUICKDRAFT_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* CPUID leaf 7 EDX bits */
#define AMX_BF16_BIT 22
#define AMX_TILE_BIT 24
#define AMX_INT8_BIT 25

/* Whether the CPU has AMX tiles with the unit of cpuid bit `unit`, AVX-512 BW and VL (what the
 * kernels use around the tiles), and Linux let this process use the tiles (each process asks
 * once; torch's oneDNN may have asked already). */
static int amx_permitted(int unit) {
    unsigned int eax, ebx, ecx, edx;
    __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
    if (!((edx >> AMX_TILE_BIT) & 1) || !((edx >> unit) & 1)) return 0;
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return 0;
#ifdef __linux__
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;  /* tiles are requested through Linux's arch_prctl; elsewhere the other paths run */
#endif
}

/* Configure this thread's 8 tiles as 16 rows of 64 bytes (release them with _tile_release). */
__attribute__((target("amx-tile")))
static inline void amx_configure(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t bytes_per_row[16];
        uint8_t rows[16];
    } config;
    memset(&config, 0, sizeof(config));
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = 16;
        config.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&config);
}

#endif
