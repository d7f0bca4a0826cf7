/* BLAKE2b (RFC 7693) with a digest length and no key: what hashlib.blake2b(data,
 * digest_size=n) computes, for the compiled span-id hashing (_stage_ids.pxi). Written from the
 * RFC's description; tests/core/test_twins.py checks it against hashlib. */

/* Why it looks unrolled: span ids hash 150-260 bytes (2-3 compressions) and the hashing was
 * 6-9% of the kernel's CPU. The RFC's loop over 12 rounds reads the message words through
 * the sigma table (m[sigma[r][i]]), an index known only at run time, so the words and the
 * working vector stay in memory. Here each round is written out with the RFC's sigma row as
 * literal indices (NATS_OTEL_B2_ROUND below, one line per row of the RFC's table), and v
 * is 16 scalars, which the compiler keeps in registers as far as they go. The message words
 * are loaded with memcpy on little-endian machines (one load each), byte by byte elsewhere.
 * Portable C, no SIMD: the same code on any x86-64 and aarch64. About 1.3-1.4 times as
 * fast as the loop on x86-64 (bench/blake2b_cost.py). RFC 7693's description (sections 2
 * and 3) stays the reference; the arithmetic and its order are the RFC's. */
#ifndef NATS_OTEL_BLAKE2B_H
#define NATS_OTEL_BLAKE2B_H

#include <stdint.h>
#include <string.h>

static const uint64_t nats_otel_b2_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

/* Rotations by a constant: compilers turn this into one rotate instruction. */
#define NATS_OTEL_B2_ROTR(x, n) (((x) >> (n)) | ((x) << (64 - (n))))

static inline uint64_t nats_otel_b2_load(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    memcpy(&x, p, 8); /* the word is little-endian, as the machine: one unaligned load */
    return x;
#else
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
#endif
}

/* The RFC's mixing function G on v##a, v##b, v##c, v##d with the message words x and y. */
#define NATS_OTEL_B2_G(a, b, c, d, x, y)                    \
    do {                                                    \
        v##a = v##a + v##b + (x);                           \
        v##d = NATS_OTEL_B2_ROTR(v##d ^ v##a, 32);          \
        v##c = v##c + v##d;                                 \
        v##b = NATS_OTEL_B2_ROTR(v##b ^ v##c, 24);          \
        v##a = v##a + v##b + (y);                           \
        v##d = NATS_OTEL_B2_ROTR(v##d ^ v##a, 16);          \
        v##c = v##c + v##d;                                 \
        v##b = NATS_OTEL_B2_ROTR(v##b ^ v##c, 63);          \
    } while (0)

/* One round, given its row of the RFC's sigma table: the columns, then the diagonals. */
#define NATS_OTEL_B2_ROUND(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) \
    do {                                                                                        \
        NATS_OTEL_B2_G(0, 4, 8, 12, m[s0], m[s1]);                                              \
        NATS_OTEL_B2_G(1, 5, 9, 13, m[s2], m[s3]);                                              \
        NATS_OTEL_B2_G(2, 6, 10, 14, m[s4], m[s5]);                                             \
        NATS_OTEL_B2_G(3, 7, 11, 15, m[s6], m[s7]);                                             \
        NATS_OTEL_B2_G(0, 5, 10, 15, m[s8], m[s9]);                                             \
        NATS_OTEL_B2_G(1, 6, 11, 12, m[s10], m[s11]);                                           \
        NATS_OTEL_B2_G(2, 7, 8, 13, m[s12], m[s13]);                                            \
        NATS_OTEL_B2_G(3, 4, 9, 14, m[s14], m[s15]);                                            \
    } while (0)

static void nats_otel_b2_compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last) {
    uint64_t m[16];
    for (int i = 0; i < 16; i++) m[i] = nats_otel_b2_load(block + 8 * i);
    uint64_t v0 = h[0], v1 = h[1], v2 = h[2], v3 = h[3], v4 = h[4], v5 = h[5], v6 = h[6], v7 = h[7];
    uint64_t v8 = nats_otel_b2_iv[0], v9 = nats_otel_b2_iv[1], v10 = nats_otel_b2_iv[2], v11 = nats_otel_b2_iv[3];
    uint64_t v12 = nats_otel_b2_iv[4] ^ t; /* inputs here are far below 2**64 bytes: the high word of t stays 0 */
    uint64_t v13 = nats_otel_b2_iv[5];
    uint64_t v14 = last ? ~nats_otel_b2_iv[6] : nats_otel_b2_iv[6];
    uint64_t v15 = nats_otel_b2_iv[7];
    /* The 12 rounds: rows 0-9 of sigma, then rows 0 and 1 again (RFC 7693, 2.7 and 3.2). */
    NATS_OTEL_B2_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    NATS_OTEL_B2_ROUND(14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3);
    NATS_OTEL_B2_ROUND(11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4);
    NATS_OTEL_B2_ROUND(7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8);
    NATS_OTEL_B2_ROUND(9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13);
    NATS_OTEL_B2_ROUND(2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9);
    NATS_OTEL_B2_ROUND(12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11);
    NATS_OTEL_B2_ROUND(13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10);
    NATS_OTEL_B2_ROUND(6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5);
    NATS_OTEL_B2_ROUND(10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0);
    NATS_OTEL_B2_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    NATS_OTEL_B2_ROUND(14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3);
    h[0] ^= v0 ^ v8;
    h[1] ^= v1 ^ v9;
    h[2] ^= v2 ^ v10;
    h[3] ^= v3 ^ v11;
    h[4] ^= v4 ^ v12;
    h[5] ^= v5 ^ v13;
    h[6] ^= v6 ^ v14;
    h[7] ^= v7 ^ v15;
}

#undef NATS_OTEL_B2_ROUND
#undef NATS_OTEL_B2_G
#undef NATS_OTEL_B2_ROTR
/* The BLAKE2b digest (outlen 1..64 bytes) of the concatenation of up to 4 parts. */
static void nats_otel_blake2b(uint8_t *out, size_t outlen, const uint8_t *parts[], const size_t sizes[], int count) {
    uint64_t h[8];
    uint8_t block[128];
    size_t filled = 0;
    uint64_t t = 0;
    for (int i = 0; i < 8; i++) h[i] = nats_otel_b2_iv[i];
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    for (int p = 0; p < count; p++) {
        const uint8_t *data = parts[p];
        size_t size = sizes[p];
        while (size > 0) {
            if (filled == 128) { /* a full block with more input after it: not the last */
                t += 128;
                nats_otel_b2_compress(h, block, t, 0);
                filled = 0;
            }
            size_t take = 128 - filled < size ? 128 - filled : size;
            memcpy(block + filled, data, take);
            filled += take;
            data += take;
            size -= take;
        }
    }
    t += filled;
    memset(block + filled, 0, 128 - filled);
    nats_otel_b2_compress(h, block, t, 1);
    for (size_t i = 0; i < outlen; i++) out[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

#endif
