/* gemv_tc.cuh - the streaming bf16 GEMV's 512-byte warp step on tensor cores (k_gvb's TC form,
 * gemv_bf16.cu, MS_CU_BF16_STREAM_MMA), apart from the kernel so that the host emulation
 * (tests/backend/test_gemv_tc_emu.sh) runs these very lines with an mma rebuilt from the PTX tables.
 *
 * Why: in k_gvb each lane's step is 8 bf16 weights times 8 x values, on CUDA cores: 8 FMAs plus 16
 * integer instructions to widen both bf16 vectors to fp32, about 84 instructions a warp step in all
 * (session 24's ncu). At the copy rate of the H200 an SM has ~120 issue slots per 512-byte step of
 * its 32 warps, so the stream runs with the schedulers more than half busy and any stall shows as
 * bandwidth. Two mma.sync replace the 24 math instructions and need no widening.
 *
 * The placement. A dot product is a sum over k, so the k order of the operands is free as long as
 * weights and x agree. Lane (g, t) (g = lane / 4, t = lane % 4) hands its 16 bytes of weights w0..w7
 * to both mma as A just as they came from the ring, {a01, a23, a45, a67} = {w01, w23, w45, w67}, which
 * puts w0, w1, w4, w5 in row g (columns 2t, 2t+1, 2t+8, 2t+9) and w2, w3, w6, w7 in row g+8 (PTX ISA,
 * "Matrix Fragments for mma.m16n8k16"). B's column g comes from the four lanes of group g, a lane's
 * two registers at k = 2t, 2t+1 and 2t+8, 2t+9: the first mma takes {x01, x45}, so D1[g][g] = sum over
 * k of A[g][k] B[k][g] pairs each weight of row g with the x value of the same lane and position: it is
 * w0 x0 + w1 x1 + w4 x4 + w5 x5 summed over the group's four lanes. The second takes {x23, x67} and
 * puts w2 x2 + w3 x3 + w6 x6 + w7 x7 on D2[g+8][g]. The two need their own accumulators (each mma's
 * other row lands on the other's element). So the warp's dot product is the sum over g = 0..7 of
 * D1[g][g] + D2[g+8][g]; every other element pairs unrelated weights and x and is never read. Both sit
 * in lane 4g + g/2 (C's fragment: c0, c1 = D[g][2t, 2t+1], c2, c3 = D[g+8][2t, 2t+1]), in register
 * g % 2 of D1 and 2 + g % 2 of D2.
 *
 * x is kept in shared memory with each 16-byte unit's middle words swapped (gt_perm: {x01, x45, x23,
 * x67}), so that one 16-byte load gives both B pairs in adjacent registers: the mma takes operands in
 * aligned register pairs and quads, and any other order costs moves at every step.
 *
 * Accuracy: bf16 products are exact in fp32 and the tensor core sums them into the fp32 accumulator
 * (its own adding, not an IEEE round-to-nearest at each add), so the result is the CUDA-core form's up
 * to summation order and that rounding (not the same bits). A lane with no weights at a step
 * (past the end of a K share) hands zeros as weights (copied so) and must meet finite x: its x meets its
 * own weights on the diagonal, so the kernel pads each x row with zeros rather than read past it. */
#ifndef MS_BACKEND_CUDA_GEMV_TC_CUH
#define MS_BACKEND_CUDA_GEMV_TC_CUH

/* A 16-byte unit of x (8 bf16) in the order gt_step reads it: {x01, x45, x23, x67}. */
__device__ __forceinline__ uint4 gt_perm(const uint4 &x) { return make_uint4(x.x, x.z, x.y, x.w); }

/* d += this lane's 8 weights w times its 8 x values (xp: gt_perm of them), summed over the warp on the
 * diagonals of d[0] (D1) and d[1] (D2); see above. Warp-wide: every lane calls it with its own w and
 * xp. */
__device__ __forceinline__ void gt_step(float (&d)[2][4], const uint4 &w, const uint4 &xp) {
    const uint32_t a[4] = {w.x, w.y, w.z, w.w};
    cu_mma_bf16(d[0], a, xp.x, xp.y);
    cu_mma_bf16(d[1], a, xp.z, xp.w);
}

/* The warp's dot product accumulated in d by gt_step, on every lane (a fixed xor tree over the 8 lanes
 * holding the diagonals, so the order is the same at every call). Warp-wide. */
__device__ __forceinline__ float gt_sum(const float (&d)[2][4], int lane) {
    float r = (lane & 3) == (lane >> 3) ? ((lane & 4) ? d[0][1] + d[1][3] : d[0][0] + d[1][2]) : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

#endif
