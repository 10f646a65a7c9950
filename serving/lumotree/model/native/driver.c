/* Replays native-forward calls recorded by remote.py in a process of its own: a cross-compiled
 * build run under qemu-user (the ARM64 NEON path's parity tests on an x86 machine) or a profiler
 * (callgrind counts the instructions of the calls alone, without Python).
 *
 *   driver IMAGE OUT [REPEAT]
 *   driver --layout        prints lt_layout()'s table, "name value" a line (this target's layout)
 *
 * IMAGE (little endian): "LTIMG1\0\0"; u32 regions, each u64 bytes + the bytes; u32 relocations, each
 * (u32 region, u64 offset) -> (u32 region, u64 offset): a pointer to write; u32 calls, each u32 call
 * id (CALLS below), u32 args, each u32 kind (0: the int64 that follows, 1: a pointer u32 region +
 * u64 offset). The calls run REPEAT times (default 1); OUT gets every region's bytes after them,
 * then each call's int64 result. Exit status 2 on a malformed image.
 */
#include <stdio.h>
#include <stdlib.h>

#include "forward.c"

enum { CALL_VERIFY, CALL_PUBLISH, CALL_LOGITS, CALL_MTP_STEP, CALL_MTP_PROPOSE, N_CALLS };
#define MAX_ARGS 12

static FILE* in;
static void need(void* p, size_t n) {
    if (fread(p, 1, n, in) != n) {
        fprintf(stderr, "driver: truncated image\n");
        exit(2);
    }
}
static uint32_t u32(void) { uint32_t v; need(&v, 4); return v; }
static uint64_t u64(void) { uint64_t v; need(&v, 8); return v; }

static int64_t run(uint32_t id, const uint64_t* a) {
    switch (id) {
    case CALL_VERIFY:
        lt_verify((const Model*)a[0], (const Rows*)a[1], (const int64_t*)a[2], (float*)a[3], (float*)a[4]);
        return 0;
    case CALL_PUBLISH:
        lt_publish((const Model*)a[0], (const Rows*)a[1], (const int64_t*)a[2], (int32_t)a[3], (float*)a[4]);
        return 0;
    case CALL_LOGITS: lt_logits((const Model*)a[0], (const float*)a[1], (int32_t)a[2], (float*)a[3]); return 0;
    case CALL_MTP_STEP:
        lt_mtp_step((const Model*)a[0], (const Rows*)a[1], (const float*)a[2], (const int64_t*)a[3], (float*)a[4],
                    (float*)a[5], (float*)a[6]);
        return 0;
    case CALL_MTP_PROPOSE:
        return lt_mtp_propose((const Model*)a[0], (Rows*)a[1], (const float*)a[2], (const int64_t*)a[3],
                              (int32_t)a[4], (int32_t)a[5], (float*)a[6], (float*)a[7], (float*)a[8],
                              (int64_t*)a[9]);
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "--layout")) {
        for (const LtLayout* e = lt_layout(); e->name; e++) printf("%s %lld\n", e->name, (long long)e->value);
        return 0;
    }
    if (argc < 3 || !(in = fopen(argv[1], "rb"))) {
        fprintf(stderr, "usage: driver IMAGE OUT [REPEAT] | driver --layout\n");
        return 2;
    }
    char magic[8];
    need(magic, 8);
    if (memcmp(magic, "LTIMG1\0\0", 8)) {
        fprintf(stderr, "driver: not an image\n");
        return 2;
    }
    uint32_t n = u32();
    char** base = calloc(n, sizeof *base);
    uint64_t* size = calloc(n, sizeof *size);
    for (uint32_t i = 0; i < n; i++) {
        size[i] = u64();
        base[i] = aligned_alloc(64, (size[i] + 63) / 64 * 64);
        need(base[i], size[i]);
    }
    uint32_t nrel = u32();
    for (uint32_t i = 0; i < nrel; i++) {
        uint32_t r = u32();
        uint64_t off = u64();
        uint32_t t = u32();
        uint64_t toff = u64();
        if (r >= n || t >= n || off + 8 > size[r]) return 2;
        char* p = base[t] + toff;
        memcpy(base[r] + off, &p, 8);
    }
    uint32_t ncalls = u32();
    uint32_t* ids = calloc(ncalls, 4);
    uint64_t(*args)[MAX_ARGS] = calloc(ncalls, sizeof *args);
    for (uint32_t c = 0; c < ncalls; c++) {
        ids[c] = u32();
        uint32_t na = u32();
        if (ids[c] >= N_CALLS || na > MAX_ARGS) return 2;
        for (uint32_t j = 0; j < na; j++) {
            if (u32() == 0) {
                args[c][j] = u64();
            } else {
                uint32_t r = u32();
                if (r >= n) return 2;
                args[c][j] = (uint64_t)(base[r] + u64());
            }
        }
    }
    fclose(in);
    int repeat = argc > 3 ? atoi(argv[3]) : 1;
    int64_t* results = calloc(ncalls, 8);
    for (int k = 0; k < repeat; k++)
        for (uint32_t c = 0; c < ncalls; c++) results[c] = run(ids[c], args[c]);
    FILE* out = fopen(argv[2], "wb");
    if (!out) return 2;
    for (uint32_t i = 0; i < n; i++) fwrite(base[i], 1, size[i], out);
    fwrite(results, 8, ncalls, out);
    return fclose(out) ? 2 : 0;
}
