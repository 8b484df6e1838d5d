/* main.cpp - the claiming bf16 GEMV's walk (src/backend/cuda/gemv_walk.cuh, the order in which k_gvd's
 * warps take their units) run on the host: every warp of a launch is a gd_walk, driven as the kernel
 * drives it (the early steps before the PDL wait, the GB_D - 1 steps of the ring's fill, then rounds of
 * one math step and one load step), and a scheduler interleaves the warps' rounds at random. A claim is
 * an entry in flight until the scheduler performs it on the shared counter (or the warp takes its
 * answer), as an atomic's answer may come back late. Checked for every plan the host can make for
 * GLM-4.5-Air's projections and for odd shapes, at several static shares, forced K splits and seeds:
 *   - at every step index the math stream works on the (unit, run) the load stream copied there;
 *   - every unit is computed once, its runs in order by one warp, ending with "last";
 *   - no claim is asked before the wait, and none is left unanswered;
 *   - each warp's real load steps equal its math steps;
 *   - every row is written once (a row inside a warp's static range by that warp, its shares in order;
 *     any other row of several shares by the warp whose count completes it), and the
 *     launch leaves the claim, done and row counters at zero for the next one, also across launches of
 *     different shapes on the same counters.
 * A plan that breaks the walk's rule (a claimed range shorter than GB_D - 1 steps followed by another)
 * must be caught: the control case. The arithmetic and the counters' memory order are test_cuda_ops'
 * to check on the GPU (test_linear_bf16_dyn: the same bits as the fixed form). */
#include "backend/cuda/gemv_walk.cuh"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static const int D = GD_RING;

static int n_pass, n_fail;

struct Warp {
    gd_walk w;
    std::vector<int> lu, lj; /* per load step: unit and run, -1 when not real */
    bool claim_out = false;  /* asked, not performed */
    bool answered = false;   /* performed, not taken */
    unsigned answer = 0;
    bool done = false;
};

/* The device memory a launch leaves to the next: the claim and done counters (ctl[0], ctl[1]) and the
 * rows' share counts, which every launch must leave at zero (k_gvd's resets, modelled as it does them). */
struct Mem {
    unsigned ctl0 = 0, ctl1 = 0;
    std::vector<unsigned> rowcnt = std::vector<unsigned>(1 << 16, 0u);
};

struct Sim {
    gd_shape sh;
    int W, q0;
    bool early;
    Mem *mem = nullptr;
    unsigned &ctr() { return mem->ctl0; }
    std::vector<int> row_done, local_warp, local_next;
    std::vector<Warp> wp;
    std::vector<int> inflight; /* warps with a claim not yet performed */
    std::vector<int> unit_warp, unit_next_run;
    std::mt19937_64 rng;
    int errors = 0;
    char first[256] = "";

    void err(const char *msg) {
        if (!errors++) snprintf(first, sizeof first, "%s", msg);
    }
    void perform(int i) { /* the atomic of warp i's claim */
        Warp &x = wp[i];
        x.answer = ctr();
        ctr() += (unsigned)sh.g;
        x.claim_out = false;
        x.answered = true;
        for (size_t k = 0; k < inflight.size(); k++)
            if (inflight[k] == i) {
                inflight.erase(inflight.begin() + (long)k);
                break;
            }
    }
    void put(int i, bool may_claim) {
        Warp &x = wp[i];
        auto ask = [&]() {
            if (!may_claim) err("a claim was asked before the PDL wait");
            if (x.claim_out || x.answered) err("a claim was asked while another was in flight");
            x.claim_out = true;
            inflight.push_back(i);
        };
        auto take = [&]() -> unsigned {
            if (x.claim_out) perform(i);
            if (!x.answered) {
                err("an answer was taken with no claim asked");
                return 0;
            }
            x.answered = false;
            return x.answer;
        };
        int u, j, kcu;
        const bool real = gd_load(x.w, sh, may_claim, ask, take, u, j, kcu);
        x.lu.push_back(real ? u : -1);
        x.lj.push_back(real ? j : -1);
        if (real && (u < 0 || u >= sh.U || j * 32 >= kcu)) err("the load stream left the work");
    }
    /* one round of warp i; false once it has finished */
    bool round(int i) {
        Warp &x = wp[i];
        int u, j, kcu;
        bool last;
        if (!gd_math(x.w, sh, u, j, kcu, last)) {
            x.done = true;
            if (++mem->ctl1 == (unsigned)W) mem->ctl0 = mem->ctl1 = 0; /* the last warp done resets */
            return false;
        }
        const int s = x.w.ndone - 1;
        if (s >= (int)x.lu.size() || x.lu[s] != u || x.lj[s] != j) {
            char m[200];
            snprintf(m, sizeof m, "warp %d step %d: math on unit %d run %d, the ring holds unit %d run %d", i, s, u, j,
                     s < (int)x.lu.size() ? x.lu[s] : -2, s < (int)x.lj.size() ? x.lj[s] : -2);
            err(m);
        }
        if (u >= 0 && u < sh.U) {
            if (j == 0) {
                if (unit_warp[u] != -1) err("a unit was computed twice");
                unit_warp[u] = i;
            } else if (unit_warp[u] != i || unit_next_run[u] != j) {
                err("a unit's runs were not computed in order by one warp");
            }
            unit_next_run[u] = j + 1;
            const bool want_last = (j + 1) * 32 >= kcu;
            if (last != want_last) err("a unit's end was misplaced");
            if (last) { /* a row inside the warp's static range is summed by that warp; any other unit's
                         * partial is counted and the row's last count writes it (k_gvd) */
                const int n = u >> sh.kshift, q = u & sh.msk;
                if (gd_row_inside(sh, u, i * q0, i * q0 + q0)) {
                    if (u >= sh.ustat) err("a claimed unit was summed as its warp's own row");
                    if (q == 0) {
                        local_warp[n] = i;
                        local_next[n] = 1;
                    } else if (local_warp[n] != i || local_next[n] != q) {
                        err("a static row's shares were not computed in order by one warp");
                    } else {
                        local_next[n]++;
                    }
                    if (q == sh.msk) row_done[n]++;
                } else if (sh.msk == 0) {
                    row_done[n]++;
                } else if (mem->rowcnt[n]++ == (unsigned)sh.msk) {
                    row_done[n]++;
                    mem->rowcnt[n] = 0;
                }
            }
        } else {
            err("the math stream left the work");
        }
        put(i, true);
        return true;
    }
    /* runs the launch; bias: 0 = uniform, 1 = warp 0 favoured, 2 = the last warp starved; late: claims
     * performed only when taken */
    void run(int bias, bool late) {
        wp.assign((size_t)W, Warp());
        row_done.assign((size_t)(sh.U >> sh.kshift), 0);
        local_warp.assign((size_t)(sh.U >> sh.kshift), -1);
        local_next.assign((size_t)(sh.U >> sh.kshift), 0);
        if (mem->ctl0 || mem->ctl1) err("the launch found the claim counters non-zero");
        for (int n = 0; n < (sh.U >> sh.kshift); n++)
            if (mem->rowcnt[(size_t)n]) {
                err("the launch found a row count non-zero");
                break;
            }
        unit_warp.assign((size_t)sh.U, -1);
        unit_next_run.assign((size_t)sh.U, 0);
        for (int i = 0; i < W; i++) {
            gd_walk_init(wp[i].w, i * q0, q0);
            if (early)
                for (int k = 0; k < D - 1; k++) put(i, false);
        }
        for (int i = 0; i < W; i++)
            if (!early)
                for (int k = 0; k < D - 1; k++) put(i, true);
        std::vector<int> live;
        for (int i = 0; i < W; i++) live.push_back(i);
        long guard = 0;
        while (!live.empty() && guard++ < 100000000L) {
            if (!late && !inflight.empty() && rng() % 3 == 0) perform(inflight[rng() % inflight.size()]);
            size_t k = rng() % live.size();
            if (bias == 1 && rng() % 2) k = 0;
            if (bias == 2 && live.size() > 1 && live[k] == W - 1 && rng() % 8) k = (k + 1) % live.size();
            if (!round(live[k])) live.erase(live.begin() + (long)k);
        }
        for (int u = 0; u < sh.U; u++) {
            if (unit_warp[u] < 0) {
                err("a unit was never computed");
                break;
            }
            const int kcu = gd_kcu(sh, u);
            if (unit_next_run[u] * 32 < kcu) {
                err("a unit was left unfinished");
                break;
            }
        }
        for (size_t n = 0; n < row_done.size(); n++)
            if (row_done[n] != 1) {
                err("a row was written other than once");
                break;
            }
        if (mem->ctl0 || mem->ctl1) err("the launch left the claim counters non-zero");
        for (size_t n = 0; n < mem->rowcnt.size(); n++)
            if (mem->rowcnt[n]) {
                err("the launch left a row count non-zero");
                break;
            }
        for (int i = 0; i < W; i++) {
            if (wp[i].claim_out || wp[i].answered) err("a claim was left in flight at the end");
            if (wp[i].w.nreal != wp[i].w.ndone) err("load and math step counts differ");
            if (!wp[i].done) err("a warp did not finish");
        }
    }
};

/* One plan, several seeds and schedules; expect_ok = 0 for the control case (must fail somewhere). */
static void check(const char *name, int N, int K8, int W, const gd_plan &p, bool expect_ok, int seed_step) {
    int errors = 0;
    char first[256] = "";
    for (int seed = 0; seed < 6; seed += seed_step) {
        Mem mem;
        Sim s;
        s.mem = &mem;
        s.sh = {K8, p.kc, p.ks - 1, p.kshift, N * p.ks, W * p.q0, p.g};
        s.W = W;
        s.q0 = p.q0;
        s.early = p.early;
        s.rng.seed((uint64_t)seed * 7919u + (uint64_t)N * 31u + (uint64_t)K8);
        s.run(seed % 3, seed >= 3);
        if (s.errors && !errors) snprintf(first, sizeof first, "seed %d: %.200s", seed, s.first);
        errors += s.errors;
    }
    const bool ok = expect_ok ? errors == 0 : errors > 0;
    if (ok) {
        n_pass++;
    } else {
        n_fail++;
        if (expect_ok)
            printf("FAIL %s N=%d K8=%d W=%d ks=%d q0=%d g=%d early=%d: %d errors; first: %s\n", name, N, K8, W, p.ks, p.q0,
                   p.g, (int)p.early, errors, first);
        else
            printf("FAIL %s: a plan that breaks the walk's rule passed unnoticed\n", name);
    }
}

int main() {
    struct {
        const char *name;
        int N, K8, W;
    } shapes[] = {
        {"Air q|k|v", 14336, 512, 4224}, {"Air o_proj", 4096, 1536, 4224}, {"lm_head slice", 20000, 512, 4224},
        {"short last share", 1000, 389, 64}, {"fewer units than warps", 70, 32, 256}, {"one chunk", 1, 1, 16},
        {"long K, few rows", 33, 5000, 96}, {"odd", 300, 513, 40}, {"three warps", 97, 17, 3},
    };
    const int pcts[] = {1, 30, 50, 80, 95};
    for (const auto &sh : shapes)
        for (int pct : pcts)
            for (int ks = 0; ks <= 8; ks = ks ? ks * 2 : 1)
                for (int early = 0; early < 2; early++) {
                    gd_plan p;
                    if (!gd_make_plan(sh.N, sh.K8, sh.W, pct, ks, early, D, p)) continue;
                    if (ks && p.ks != ks) continue; /* a forced split the shape cannot take */
                    if (p.early && (long long)p.q0 * p.spu_min < D - 1) {
                        n_fail++;
                        printf("FAIL %s: plan copies early from a static range shorter than %d steps\n", sh.name, D - 1);
                        continue;
                    }
                    if ((long long)p.g * p.spu_min < D - 1) {
                        n_fail++;
                        printf("FAIL %s: plan claims ranges shorter than %d steps\n", sh.name, D - 1);
                        continue;
                    }
                    /* the model's shapes (millions of steps a launch): fewer static shares and schedules */
                    const bool big = (long long)sh.N * sh.K8 > (1 << 20);
                    if (big && pct != 1 && pct != 80) continue;
                    check(sh.name, sh.N, sh.K8, sh.W, p, true, big ? 5 : 1);
                }
    /* launches of different shapes one after another on the same counters, as a decode step runs them
     * (q|k|v at 2 shares, o_proj at 4, whole rows, 8 shares, then q|k|v again): each must find them at zero */
    {
        struct { int N, K8, W, ks; } seq[] = {{14336, 512, 4224, 2}, {4096, 1536, 4224, 4}, {20000, 512, 4224, 1},
                                              {300, 5000, 96, 8}, {14336, 512, 4224, 2}, {1000, 389, 64, 4}};
        Mem mem;
        int errors = 0;
        char first[256] = "";
        for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
            gd_plan p;
            if (!gd_make_plan(seq[i].N, seq[i].K8, seq[i].W, 80, seq[i].ks, true, D, p) || p.ks != seq[i].ks) {
                errors++;
                snprintf(first, sizeof first, "launch %zu: no plan with %d shares", i, seq[i].ks);
                break;
            }
            Sim s;
            s.mem = &mem;
            s.sh = {seq[i].K8, p.kc, p.ks - 1, p.kshift, seq[i].N * p.ks, seq[i].W * p.q0, p.g};
            s.W = seq[i].W;
            s.q0 = p.q0;
            s.early = p.early;
            s.rng.seed(1000 + i);
            s.run((int)(i % 3), i & 1);
            if (s.errors && !errors) snprintf(first, sizeof first, "launch %zu: %.200s", i, s.first);
            errors += s.errors;
        }
        if (errors) {
            n_fail++;
            printf("FAIL launches in sequence: %d errors; first: %s\n", errors, first);
        } else {
            n_pass++;
        }
    }
    /* control: claims of one unit of one step (the rule wants D - 1 steps) must show a mismatch */
    gd_plan bad;
    if (gd_make_plan(70, 32, 256, 50, 0, false, D, bad)) {
        bad.g = 1;
        bad.q0 = 0;
        check("control (g = 1 with one-step units)", 70, 32, 256, bad, false, 1);
    } else {
        n_fail++;
        printf("FAIL control: no plan\n");
    }
    printf("## test_gvd_walk_emu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
