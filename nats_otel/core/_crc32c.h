/* CRC-32C (Castagnoli), the checksum of framed snappy's chunks, for the kernel's unframing
 * (`_stage_snappy.pxi`).
 *
 * Slicing-by-8: eight tables of 256 words, eight bytes a step (a byte a step, one table, is
 * ~2 µs for a 700-byte trace message here: more than the block's decoding). The tables are
 * made once, when the kernel is imported (`nats_otel_crc32c_init`). Portable C: the bytes are
 * read one by one, so the byte order of the machine does not matter. */
#ifndef NATS_OTEL_CRC32C_H
#define NATS_OTEL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

static uint32_t nats_otel_crc32c_tables[8][256];

static void nats_otel_crc32c_init(void) {
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

static uint32_t nats_otel_crc32c(const unsigned char *p, size_t n) {
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

#endif
