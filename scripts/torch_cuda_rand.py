"""`torch.rand` of a CUDA generator, recomputed on the CPU: the cases difftest draws with `--device cuda`
(build_topk_case(spec, seed, "cuda")) are not the ones a CPU generator draws, and a finding seen on the GPU
is reproduced on the CPU from the GPU's own tensors.

torch 2.11 fills a float32 tensor of `numel` elements with Philox4x32-10 as
aten/src/ATen/native/cuda/DistributionTemplates.h launches it: blocks of 256 threads, grid
min(SMs * (2048 / 256), ceil(numel / 256)) (calc_execution_policy), thread t seeded by curand_init(seed,
subsequence=t, offset) and drawing curand_uniform4 once per pass; draw j of pass p goes to element
p * 4T + t + j * T for T threads (distribution_elementwise_grid_stride_kernel). curand_uniform maps a 32-bit
word x to x * 2^-32 + 2^-33 in float32, and uniform_kernel turns 1.0 into 0.0. Each call advances the
generator's Philox offset by 4 per pass. Checked against the H200's own values: crowded-bin-4097-s0 holds
1.11901 at column 1681 and crowded-bin-16385-s0 1.1837 at column 416, with k-th values 1.11906 and 1.21422
(reports of `difftest run --op topk --device cuda`), which this module reproduces to the last bit shown.
"""

from __future__ import annotations

import numpy as np

H200_SMS = 132
_BLOCK = 256
_THREADS_PER_SM = 2048
_MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_KEY_STEPS = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))
_LOW32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counters: np.ndarray, seed: int) -> np.ndarray:
    """uint32 [n, 4]: Philox4x32-10 of each counter (uint64 [n, 4] holding 32-bit words) under the key `seed`
    (curand_Philox4x32_10: ten rounds, the key bumped between rounds)."""
    c = counters.astype(np.uint64)
    key = [np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)]
    for round_ in range(10):
        low_product = _MULTIPLIERS[0] * c[:, 0]
        high_product = _MULTIPLIERS[1] * c[:, 2]
        c = np.stack([((high_product >> np.uint64(32)) ^ c[:, 1] ^ key[0]) & _LOW32, high_product & _LOW32,
                      ((low_product >> np.uint64(32)) ^ c[:, 3] ^ key[1]) & _LOW32, low_product & _LOW32], axis=1)
        if round_ < 9:
            key = [(key[0] + _KEY_STEPS[0]) & _LOW32, (key[1] + _KEY_STEPS[1]) & _LOW32]
    return c.astype(np.uint32)


def passes(numel: int, sms: int = H200_SMS) -> tuple[int, int]:
    """(threads, passes) of the launch that fills `numel` elements on a GPU of `sms` multiprocessors."""
    blocks = min(sms * (_THREADS_PER_SM // _BLOCK), -(-numel // _BLOCK))
    threads = blocks * _BLOCK
    return threads, (numel - 1) // (4 * threads) + 1


def cuda_rand(seed: int, numel: int, offset: int = 0, sms: int = H200_SMS) -> tuple[np.ndarray, int]:
    """(float32 [numel], the generator's offset after the call): torch.rand(numel) of a CUDA generator seeded
    with `seed` whose Philox offset is `offset` (0 after manual_seed; each earlier call moved it)."""
    threads, count = passes(numel, sms)
    thread = np.arange(threads, dtype=np.uint64)
    out = np.empty(numel, dtype=np.float32)
    for pass_ in range(count):
        counters = np.zeros((threads, 4), dtype=np.uint64)
        counters[:, 0] = np.uint64(offset // 4 + pass_)  # skipahead(offset) then one increment per curand4
        counters[:, 2] = thread & _LOW32  # skipahead_sequence(subsequence = thread)
        counters[:, 3] = thread >> np.uint64(32)
        words = philox4x32_10(counters, seed)
        uniform = words.astype(np.float32) * np.float32(2.0 ** -32) + np.float32(2.0 ** -33)
        for draw in range(4):
            element = pass_ * 4 * threads + thread.astype(np.int64) + draw * threads
            inside = element < numel
            out[element[inside]] = uniform[inside, draw]
    out[out == np.float32(1.0)] = np.float32(0.0)
    return out, offset + 4 * count
