/* CRC-32C (Castagnoli), the checksum of framed snappy's chunks, for the kernel's unframing
 * (`_stage_snappy.pxi`).
 *
 * Two ways, the same sums: the SSE 4.2 `crc32` instruction where the processor has it (x86-64,
 * GCC or Clang: eight bytes an instruction), else slicing-by-8 (eight tables of 256 words,
 * eight bytes a step; a byte a step, one table, was ~2 µs for a 700-byte trace message here,
 * more than the block's decoding). The tables are made and the way chosen once, when the
 * kernel is imported (`nats_otel_crc32c_init`); the tests compare both with the definition.
 * The table way reads the bytes one by one: the machine's byte order does not matter. */
#ifndef NATS_OTEL_CRC32C_H
#define NATS_OTEL_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t nats_otel_crc32c_tables[8][256];
static int nats_otel_crc32c_hardware = 0;  /* 1: the SSE 4.2 instruction is used */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define NATS_OTEL_CRC32C_SSE42 1
__attribute__((target("sse4.2")))
static uint32_t nats_otel_crc32c_sse42(const unsigned char *p, size_t n) {
    uint64_t crc = 0xFFFFFFFFu;
    uint64_t word;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&word, p, 8);  /* little-endian: the instruction takes the bytes in memory order */
        crc = _mm_crc32_u64(crc, word);
    }
    uint32_t crc32 = (uint32_t)crc;
    while (n--) crc32 = _mm_crc32_u8(crc32, *p++);
    return crc32 ^ 0xFFFFFFFFu;
}
#endif

static void nats_otel_crc32c_init(void) {
#ifdef NATS_OTEL_CRC32C_SSE42
    __builtin_cpu_init();
    nats_otel_crc32c_hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);  /* reflected 0x1EDC6F41 */
        nats_otel_crc32c_tables[0][i] = crc;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = nats_otel_crc32c_tables[0][i];
        for (int k = 1; k < 8; k++) {
            crc = nats_otel_crc32c_tables[0][crc & 0xFF] ^ (crc >> 8);
            nats_otel_crc32c_tables[k][i] = crc;  /* table k: the byte followed by k zero bytes */
        }
    }
}

static uint32_t nats_otel_crc32c_table(const unsigned char *p, size_t n) {
    uint32_t (*t)[256] = nats_otel_crc32c_tables;
    uint32_t crc = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = t[7][low & 0xFF] ^ t[6][(low >> 8) & 0xFF] ^ t[5][(low >> 16) & 0xFF] ^ t[4][low >> 24]
            ^ t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* The sum, the way chosen at init. */
static uint32_t nats_otel_crc32c(const unsigned char *p, size_t n) {
#ifdef NATS_OTEL_CRC32C_SSE42
    if (nats_otel_crc32c_hardware) return nats_otel_crc32c_sse42(p, n);
#endif
    return nats_otel_crc32c_table(p, n);
}

/* The hardware way's sum, or -1 where there is none (for the tests). */
static int64_t nats_otel_crc32c_hardware_sum(const unsigned char *p, size_t n) {
#ifdef NATS_OTEL_CRC32C_SSE42
    if (nats_otel_crc32c_hardware) return nats_otel_crc32c_sse42(p, n);
#endif
    (void)p; (void)n;
    return -1;
}

#endif
