/* main.cpp - runs the absorbed-MLA tensor-core kernel of src/backend/cuda/attn_mla_mma.cu on the host
 * (through emu.h; the kernel source is included after test_mla_mma_emu.sh swaps its CUDA-only lines)
 * and compares it with a float64 softmax(Q·Kᵀ)·V written here from the definition, so the warp split
 * of Q·Kᵀ, the exchange of partial scores and the masking/gather logic are checked without a GPU.
 * Cases: latent widths 576 (36 k-steps, 18 + 18), 160 (5 + 5) and 80 (3 + 2: the odd split), dense
 * causal and DSA top-k lists with -1 holes and keys past the position, tokens below and above top-k,
 * split-K with empty key ranges (the partials merged here as cu_attn_combine does), walks of up to 7
 * tiles and ranges starting past tile 0 (the key addresses run two tiles ahead of the copies),
 * positions past the block table (masked pages, whole masked ranges), 80 heads (a partial second
 * group, so some head tiles idle) and 20 heads (a head tile with 4 real heads), paged cache with a
 * shuffled block table; the same for the 16-head decode form (4 warps splitting one head tile's Q·Kᵀ
 * and columns 4 ways) at decode shapes (1-4 tokens, contexts up to 1100, pages of 1/16/64), and the
 * host's rule choosing the form. The GPU itself is covered by test_cuda_ops on the GPU machine. */
#include "mla_emu.cpp"

#include <random>

static std::mt19937_64 R(2026);
static double urand() { return (double)(R() >> 11) / 9007199254740992.0 * 2.0 - 1.0; }
static int n_pass, n_fail;

struct tok {
    int seq, pos;
};

/* One launch of the HB-head form on tokens toks of sequences with contexts ctx (page-sized cache pages
 * at shuffled physical pages), checked against the float64 reference and the exact MMA count. */
template <int DK, int DV, int HB = 64>
static void run_case(const char *name, int nh, int topk, int n_split, const std::vector<int> &ctx,
                     const std::vector<tok> &toks, int page = 16) {
    const int n_seqs = (int)ctx.size(), T = (int)toks.size();
    int max_blocks = 0;
    for (int c : ctx) max_blocks = std::max(max_blocks, (c + page - 1) / page);
    /* block table: every page of every sequence at a distinct shuffled physical page */
    std::vector<int32_t> bt((size_t)n_seqs * max_blocks, -1), perm;
    for (int i = 0; i < n_seqs * max_blocks; i++) perm.push_back(i);
    std::shuffle(perm.begin(), perm.end(), R);
    for (int s = 0, n = 0; s < n_seqs; s++)
        for (int p = 0; p < (ctx[s] + page - 1) / page; p++) bt[(size_t)s * max_blocks + p] = perm[n++];
    const size_t slots = (size_t)n_seqs * max_blocks * page;
    std::vector<bf16> lat(slots * DK), q((size_t)T * nh * DK);
    for (auto &v : lat) v.v = f2bf((float)urand());
    for (auto &v : q) v.v = f2bf((float)(2.0 * urand()));
    std::vector<int32_t> pos(T), tseq(T), tk((size_t)T * std::max(topk, 1), -1);
    for (int t = 0; t < T; t++) {
        pos[t] = toks[t].pos;
        tseq[t] = toks[t].seq;
        if (topk > 0 && pos[t] + 1 > topk) { /* distinct causal keys in random order, a few -1 holes */
            std::vector<int> keys;
            for (int j = 0; j <= pos[t]; j++) keys.push_back(j);
            std::shuffle(keys.begin(), keys.end(), R);
            /* holes (-1) and a few keys past the token's position, which the kernel must mask */
            for (int c = 0; c < topk; c++)
                tk[(size_t)t * topk + c] = (c % 7 == 3) ? -1 : (c % 11 == 5) ? pos[t] + 1 + c : keys[c];
        }
    }
    const float scale = 1.f / sqrtf((float)DK);
    const int groups = (nh + HB - 1) / HB;
    std::vector<bf16> out((size_t)T * nh * DV);
    for (auto &v : out) v.v = 0x7fc0; /* NaN */
    std::vector<float> part(n_split > 1 ? (size_t)T * nh * n_split * (DV + 2) : 0, NAN);
    mm_args a;
    memset(&a, 0, sizeof a);
    a.q = q.data();
    a.lat = lat.data();
    a.out = out.data();
    a.nh = nh;
    a.sl2 = scale * 1.4426950408889634f;
    a.positions = pos.data();
    a.token_seq = tseq.data();
    a.block_table = bt.data();
    a.topk = topk > 0 ? tk.data() : nullptr;
    a.topk_n = topk;
    a.max_blocks = max_blocks;
    a.page_size = page;
    a.n_split = n_split;
    a.part = n_split > 1 ? part.data() : nullptr;
    ms_backend b;
    ms_err e;
    const long mma0 = emu_total_mma;
    if (mm_launch<DK, DV, HB>(&b, &a, dim3((unsigned)T, (unsigned)groups, (unsigned)n_split), &e) != MS_OK) abort();
    /* reference and comparison, row by row: max |diff| / max |ref| over the row's DV values */
    double worst = 0;
    long tiles = 0;
    for (int t = 0; t < T; t++) {
        const bool dense = topk == 0 || pos[t] + 1 <= topk;
        std::vector<int> keys;
        const int nk = dense ? pos[t] + 1 : topk;
        tiles += (nk + MM_BN - 1) / MM_BN;
        for (int i = 0; i < nk; i++) {
            const int k = dense ? i : tk[(size_t)t * topk + i];
            if (k >= 0 && k <= pos[t] && k / page < max_blocks) keys.push_back(k); /* as the kernel masks */
        }
        for (int h = 0; h < nh; h++) {
            const bf16 *qh = &q[((size_t)t * nh + h) * DK];
            std::vector<double> s(keys.size());
            double mx = -INFINITY;
            for (size_t j = 0; j < keys.size(); j++) {
                const int k = keys[j];
                const size_t slot = (size_t)bt[(size_t)tseq[t] * max_blocks + k / page] * page + k % page;
                double d = 0;
                for (int c = 0; c < DK; c++) d += (double)bf2f(qh[c].v) * bf2f(lat[slot * DK + c].v);
                s[j] = d * scale;
                mx = std::max(mx, s[j]);
            }
            std::vector<double> ref(DV, 0.0);
            double l = 0;
            for (size_t j = 0; j < keys.size(); j++) {
                const int k = keys[j];
                const size_t slot = (size_t)bt[(size_t)tseq[t] * max_blocks + k / page] * page + k % page;
                const double p = exp(s[j] - mx);
                l += p;
                for (int c = 0; c < DV; c++) ref[c] += p * bf2f(lat[slot * DK + c].v);
            }
            std::vector<double> got(DV);
            const size_t row = (size_t)t * nh + h;
            if (n_split > 1) { /* merge the partials as k_attn_combine does */
                double M = -INFINITY, L = 0;
                for (int z = 0; z < n_split; z++) M = std::max(M, (double)part[(row * n_split + z) * (DV + 2) + DV]);
                std::vector<double> acc(DV, 0.0);
                for (int z = 0; z < n_split; z++) {
                    const float *p = &part[(row * n_split + z) * (DV + 2)];
                    const double w = M == -INFINITY ? 0.0 : exp((double)p[DV] - M);
                    if (w == 0.0) continue;
                    L += w * p[DV + 1];
                    for (int c = 0; c < DV; c++) acc[c] += w * p[c];
                }
                for (int c = 0; c < DV; c++) got[c] = L > 0 ? acc[c] / L : 0.0;
            } else {
                for (int c = 0; c < DV; c++) got[c] = bf2f(out[row * DV + c].v);
            }
            double md = 0, mr = 1e-30;
            for (int c = 0; c < DV; c++) {
                const double r = l > 0 ? ref[c] / l : 0.0;
                const double d = fabs(got[c] - r);
                md = std::isnan(d) ? INFINITY : std::max(md, d);
                mr = std::max(mr, fabs(r));
            }
            worst = std::max(worst, md / mr);
        }
    }
    /* tensor work: per 32-key tile and active head tile, Q·Kᵀ k-steps x 4 over the tile's 2 or 4 warps,
     * and P·V DV/8 n-tiles x 2 k-steps (16 keys each): the same in both forms */
    const long mmas = emu_total_mma - mma0;
    const int tiles_active = (nh + 15) / 16; /* head tiles with a real head, over all groups */
    const long want = tiles * tiles_active * ((DK / 16) * 4 + 2 * 2 * (DV / 16));
    const bool ok = worst <= 1e-2 && mmas == want;
    printf("%s %s (DK %d, DV %d, %d heads a block, nh %d, topk %d, n_split %d, page %d, %d tokens): row rel err %.3g, "
           "mma %ld (want %ld)\n",
           ok ? "ok  " : "FAIL", name, DK, DV, HB, nh, topk, n_split, page, T, worst, mmas, want);
    ok ? n_pass++ : n_fail++;
}

int main() {
    { /* GLM-5 width: a prefill chunk of 5 tokens at positions 60..64 after a cached prefix, dense */
        std::vector<tok> t;
        for (int p = 60; p < 65; p++) t.push_back({0, p});
        run_case<576, 512>("dense prefill", 64, 0, 1, {65}, t);
    }
    { /* DSA top-40: one token below top-k (walks 0..pos), two above (lists with holes); split-K 3
       * with empty ranges for the short token */
        std::vector<tok> t = {{0, 9}, {0, 99}, {1, 70}};
        run_case<576, 512>("dsa top-40 split", 64, 40, 3, {100, 71}, t);
    }
    { /* width 80: 5 k-steps split 3 + 2; 80 heads = a full group and one of 16 (three idle head tiles) */
        std::vector<tok> t = {{0, 33}, {0, 34}, {1, 5}};
        run_case<80, 64>("odd k-steps, 80 heads", 80, 0, 1, {35, 6}, t);
        run_case<80, 64>("odd k-steps, 80 heads, split 4", 80, 0, 4, {35, 6}, t);
    }
    { /* width 160, 20 heads (head tile 1 has 4 real heads), DSA top-48 */
        std::vector<tok> t = {{0, 20}, {0, 90}, {0, 91}};
        run_case<160, 128>("20 heads dsa top-48", 20, 48, 1, {92}, t);
    }
    { /* long walks for the key-address pipeline (keys resolved two tiles ahead): DSA top-150 (5 tiles,
       * the last one partial) and a dense token of 5 tiles, whole and split 2 (3 + 2 tiles); dense walks
       * of 9 tiles, split 2 (5 + 4 tiles: a range of 4 starting at tile 5) and split 3 (3 + 3 + 3) */
        std::vector<tok> t = {{0, 207}, {0, 140}, {0, 300}, {1, 159}};
        run_case<80, 64>("long walks dsa top-150", 64, 150, 1, {301, 160}, t);
        run_case<80, 64>("long walks dsa top-150, split 2", 64, 150, 2, {301, 160}, t);
        std::vector<tok> d = {{0, 280}, {1, 95}};
        run_case<160, 128>("long dense walks, split 2", 32, 0, 2, {281, 96}, d);
        run_case<80, 64>("long dense walks, split 3", 32, 0, 3, {281, 96}, d);
    }
    { /* positions past the block table (pages >= max_blocks masked): whole tiles and a whole split-K
       * range with no key */
        std::vector<tok> t = {{0, 63}, {0, 70}, {0, 130}};
        run_case<80, 64>("keys past the block table, split 2", 16, 0, 2, {64}, t);
    }
    { /* GLM-5 width over 5 tiles (each thread's 9 chunks on 9 rows) */
        std::vector<tok> t = {{0, 150}};
        run_case<576, 512>("dense 5 tiles", 64, 0, 1, {151}, t);
    }
    /* 16 heads a block (decode form: 4 warps = 1 head tile x 4 parts, Q·Kᵀ k-steps 9+9+9+9 at 576,
     * 3+2+3+2 at 160, 2+1+1+1 at 80). Decode shapes: 1-4 tokens, contexts 1..1100 (not multiples of
     * 32), pages of 1, 16 and 64, split-K and not, DSA lists with -1 holes and keys past the position */
    { /* GLM-5 width: batch 1 at ctx 100 (4 tiles, the last partial), one-tile ranges as the host picks
       * them at batch 1, and whole; batch 2 on 64-key pages at ctx 1 and 45 */
        std::vector<tok> t = {{0, 99}};
        run_case<576, 512, 16>("hs16 decode b1 ctx 100, 4 ranges", 64, 0, 4, {100}, t);
        run_case<576, 512, 16>("hs16 decode b1 ctx 100", 64, 0, 1, {100}, t);
        std::vector<tok> t2 = {{0, 0}, {1, 44}};
        run_case<576, 512, 16>("hs16 decode b2 page 64, split 2", 64, 0, 2, {1, 45}, t2, 64);
    }
    { /* GLM-5 width, DSA top-64 (lists with holes and keys past the position) at ctx 201, page 1 */
        std::vector<tok> t = {{0, 200}};
        run_case<576, 512, 16>("hs16 dsa top-64 page 1, split 2", 64, 64, 2, {201}, t, 1);
    }
    { /* width 80 at long contexts: batch 1 at ctx 1100 (35 tiles) split 35 and 12 (3 tiles a range) on
       * 16-key pages, batch 4 at ctx 1, 33, 700 and 1100 on 1-key and 64-key pages */
        std::vector<tok> t = {{0, 1099}};
        run_case<80, 64, 16>("hs16 decode b1 ctx 1100, 35 ranges", 64, 0, 35, {1100}, t);
        run_case<80, 64, 16>("hs16 decode b1 ctx 1100, 12 ranges", 64, 0, 12, {1100}, t);
        std::vector<tok> t4 = {{0, 0}, {1, 32}, {2, 699}, {3, 1099}};
        run_case<80, 64, 16>("hs16 decode b4 page 1, split 5", 20, 0, 5, {1, 33, 700, 1100}, t4, 1);
        run_case<80, 64, 16>("hs16 decode b4 page 64", 20, 0, 1, {1, 33, 700, 1100}, t4, 64);
    }
    { /* width 80 DSA top-96 (a token below top-k walks its dense keys) at batch 3, split 3 */
        std::vector<tok> t = {{0, 50}, {1, 500}, {2, 1000}};
        run_case<80, 64, 16>("hs16 dsa top-96 b3, split 3", 64, 96, 3, {51, 501, 1001}, t, 16);
    }
    { /* uneven parts: width 80 (k-steps 2+1+1+1) with 80 heads (5 blocks), width 160 (3+2+3+2) with 20
       * heads (a block of 4 real heads), as the 64-head cases above */
        std::vector<tok> t = {{0, 33}, {0, 34}, {1, 5}};
        run_case<80, 64, 16>("hs16 odd k-steps, 80 heads, split 4", 80, 0, 4, {35, 6}, t);
        std::vector<tok> t2 = {{0, 20}, {0, 90}, {0, 91}};
        run_case<160, 128, 16>("hs16 20 heads dsa top-48", 20, 48, 1, {92}, t2);
        std::vector<tok> t3 = {{0, 63}, {0, 70}, {0, 130}};
        run_case<160, 128, 16>("hs16 keys past the block table, split 2", 16, 0, 2, {64}, t3);
    }
    /* the host's choice of form (cu_attn_mla_mma): H200 132 SMs, GLM-5 64 heads */
    {
        const struct {
            int T, nh, tiles, force, want;
        } pk[] = {{1, 64, 32, 0, 16},   {4, 64, 32, 0, 16},   {5, 64, 32, 0, 64}, {1, 64, 64, 0, 16},
                  {2, 64, 66, 0, 64},   {4096, 64, 64, 0, 64}, {4096, 16, 64, 0, 16}, {1, 64, 32, 64, 64},
                  {4096, 64, 64, 16, 16}, {1, 128, 32, 0, 16}, {3, 128, 32, 0, 64}};
        int bad = 0;
        for (const auto &c : pk) {
            const int hb = mm_pick_hb(c.T, c.nh, c.tiles, 132, c.force);
            if (hb != c.want) {
                printf("FAIL mm_pick_hb(T %d, nh %d, tiles %d, force %d) = %d, want %d\n", c.T, c.nh, c.tiles, c.force, hb,
                       c.want);
                bad++;
            }
        }
        printf("%s host choice of heads a block: %d of %zu as expected\n", bad ? "FAIL" : "ok  ",
               (int)(sizeof pk / sizeof pk[0]) - bad, sizeof pk / sizeof pk[0]);
        bad ? n_fail++ : n_pass++;
    }
    printf("## test_mla_mma_emu%s: %d passed, %d failed\n", emu_cp_early ? " (copies landing at issue)" : "", n_pass,
           n_fail);
    return n_fail ? 1 : 0;
}
