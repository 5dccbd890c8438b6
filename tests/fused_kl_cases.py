"""Child process for ``tests/test_fused_kl.py``: runs the fused Triton kernel under the CPU
interpreter on small cases and saves its outputs (and the inputs) to an ``.npz``.

``TRITON_INTERPRET=1`` must be set before triton is imported, and must not leak into the pytest
process, so this runs as ``python tests/fused_kl_cases.py OUT.npz`` with the variable set by the
parent. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from harness.scoring.fused_kl import fused_score  # noqa: E402
from harness.scoring.scorer import score_hidden  # noqa: E402

N, H, V = 37, 64, 1000
#: Cases whose score_hidden(backend="triton") result is saved too (the dispatch check): the shared head and a
#: candidate's own head, on the two small cases (each kernel run under the interpreter costs seconds per 37 x 1000
#: positions x ids; 21 x 333 and 5 x 200 take a fraction of that). Neither V is a multiple of BLOCK_N (64) nor N of
#: BLOCK_M (16); "overflow" goes through the torch fallback as well.
VIA = ("odd_hidden", "overflow")
#: The case run again with phase 1 only (jsd_ear=False); small, as VIA's.
NOJSD = "odd_hidden"


def _base(seed: int, n: int = N, h: int = H, v: int = V, scale: float = 4.0, noise: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    head = (torch.randn(v, h, generator=g) / h**0.5 * scale).bfloat16()
    ref = torch.randn(n, h, generator=g).bfloat16()
    cand = (ref.float() + noise * torch.randn(n, h, generator=g)).bfloat16()
    y = torch.randint(0, v, (n,), generator=g)
    return ref, cand, head, y


def cases() -> dict[str, dict]:
    out: dict[str, dict] = {}
    ref, cand, head, y = _base(0)
    out["random"] = dict(ref=ref, cand=cand, head=head, y=y)
    g = torch.Generator().manual_seed(1)
    cand_head = (head.float() + 0.02 * torch.randn(head.shape, generator=g)).bfloat16()
    out["own_head"] = dict(ref=ref, cand=cand, head=head, y=y, cand_head=cand_head)
    out["identical"] = dict(ref=ref, cand=ref.clone(), head=head, y=y)
    # ties: token ids 3, 67 (next column block) and 999 (last, partial block) share one dominant
    # head row; every hidden state points along it, so the three logits tie exactly at the max.
    # The tie must hold on every CPU and GEMM (any summation order, any blocking): the tied row
    # and the hidden states are put on a 1/16 grid (|k/16| < 16: exact in bf16), so every product
    # is a multiple of 2^-8 below 2^8 and every partial sum of the 64 terms (< 2^14) is exact in
    # fp32 -- the three logits are bitwise equal however the dot is summed.
    r2, c2, h2, y2 = _base(2)
    u = torch.randn(H, generator=torch.Generator().manual_seed(3))
    u = u / u.norm()
    h2 = h2.float() * 0.1
    tied = torch.round(u * 8 * 16) / 16
    for j in (3, 67, 999):
        h2[j] = tied
    h2 = h2.bfloat16()
    r2 = (torch.round((r2.float() * 0.2 + u * 4) * 16) / 16).bfloat16()
    c2 = (torch.round((c2.float() * 0.2 + u * 4) * 16) / 16).bfloat16()
    out["ties"] = dict(ref=r2, cand=c2, head=h2, y=y2)
    out["peaked"] = dict(zip(("ref", "cand", "head", "y"), _base(4, scale=60.0, noise=0.01)))
    out["flat"] = dict(zip(("ref", "cand", "head", "y"), _base(5, scale=0.01)))
    out["odd_hidden"] = dict(zip(("ref", "cand", "head", "y"), _base(6, n=21, h=72, v=333)))  # H % BLOCK_K != 0
    # candidate logits that rise > 88 above their first-block maximum: the F term overflows and
    # those rows must be rescored by the torch path (fallback)
    r7, c7, h7, y7 = _base(7, n=5, v=200)
    ch7 = h7.float().clone()
    ch7[64:] *= 200.0
    out["overflow"] = dict(ref=r7, cand=c7, head=h7, y=y7, cand_head=ch7.bfloat16())
    return out


def main(path: str) -> int:
    save: dict[str, np.ndarray] = {}
    for name, c in cases().items():
        f = fused_score(c["ref"], c["cand"], c["head"], c["y"], c.get("cand_head"))
        t = score_hidden(c["ref"], c["cand"], c["head"], c["y"], c.get("cand_head"), backend="torch")
        # the dispatch (score_hidden(backend="triton") is the kernel) on two cases: each kernel run costs seconds here
        via = score_hidden(c["ref"], c["cand"], c["head"], c["y"], c.get("cand_head"), backend="triton") if name in VIA else None
        for k, arr in f.to_dict().items():
            save[f"{name}/fused/{k}"] = arr
            save[f"{name}/torch/{k}"] = getattr(t, k)
            if via is not None:
                save[f"{name}/via/{k}"] = getattr(via, k)
        for k in ("ref", "cand", "head", "y", "cand_head"):
            if k in c:
                save[f"{name}/in/{k}"] = c[k].float().numpy() if c[k].is_floating_point() else c[k].numpy()
        if name == "overflow":  # the raw phase-1 result, to show the fallback was needed
            raw = fused_score(c["ref"], c["cand"], c["head"], c["y"], c.get("cand_head"), fallback=False)
            save[f"{name}/raw/kld"] = raw.kld
    k = cases()[NOJSD]
    nk = fused_score(k["ref"], k["cand"], k["head"], k["y"], jsd_ear=False)
    save["nojsd/jsd_bits"] = nk.jsd_bits
    save["nojsd/ear"] = nk.ear
    save["nojsd/kld"] = nk.kld
    np.savez(path, **save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
