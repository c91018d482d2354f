"""The weights test: how much of the key's offset does a suspect's unembedding carry? Pure tensor code.

For each matrix the release changed (lm_head, and for a re-tied release the input embeddings too), take the
suspect's rows minus the base's on the rows both vocabularies share, D (n, d), and centre it over those rows,
Dc = D - 1 mean(D). The key's offset on the same rows, dW = delta (G - 1 c^T) S P, centred the same way, is

    Wc = delta (G - 1 gbar^T) A,        A = S P (L, d),   gbar the mean row of G

(centred and uncentred keys give the same Wc: the row-constant part of the offset is what centring removes, and
no output distribution sees it either). The statistic and the share are

    T     = sum_m <Dc_m, Wc>_F  =  delta * sum_{v, l} G[v, l] C[v, l],    C = sum_m Dc_m A^T   (n, L)
    share = T / (M ||Wc||_F^2)                                              (M matrices; 1 for the release)

(the G-form holds because each column of C sums to 0). C depends on the suspect, the base, S and P: never on the
secret, so T is linear in the green lists, like the text statistic. A linear merge t U~ + (1 - t) U has D = t dW
and share = t exactly.

**Null hypothesis.** The suspect was made without knowledge of the secret (the base itself, or any model derived
from it or from anything else but the release). As in text detection, the secret is uniform, so the columns of G
are exchangeable and every G[v, l] (v eligible: not special, not padding) is Bernoulli(gamma), independent.

* **Permutation test** (exact at every level above its floor 1/(K+1)): T_pi = delta sum_l (G^T C)[pi(l), l] for
  K keyed permutations pi of the lists (``key.prf.permutations``, the text test's), and
  p = (1 + #{T_pi >= T}) / (K + 1).
* **Chernoff tail bound** (below that floor): E T = delta gamma sum_{v eligible, l} C[v, l], and T - E T is a sum
  of independent terms delta (G[v, l] - gamma) C[v, l], so for every lambda >= 0
  P(T - E T >= u) <= exp(-lambda u + sum_{v, l} psi(lambda delta C[v, l])),
  psi(a) = log(1 - gamma + gamma e^a) - gamma a, each term's log-MGF exact (``detect.tail.chernoff_pvalue``
  with no Bennett remainder), minimised over lambda. The two combine as in text detection
  (``detect.tail.combined_pvalue``): the permutation p-value, or the bound where the former sits at its floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openstamp.detect.tail import TailTerms, chernoff_pvalue, combined_pvalue
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import permutations

NULL = (
    "the suspect was made without the secret: green lists uniform over secrets (columns exchangeable, each token "
    "green with probability gamma)"
)
TEST = "permutation test over the key's list assignments (K = {k}), refined below its floor by a Chernoff bound"


@dataclass
class WeightsStatistic:
    """T, its expectation under the null, the share, and the p-values (permutation, tail, combined)."""

    statistic: float
    expected: float
    share: float
    offset_norm2: float
    p_permutation: float
    p_tail: float | None
    p_value: float
    n_permutations: int


def coefficients(diffs: list[torch.Tensor], key: WatermarkKey) -> torch.Tensor:
    """C = sum_m Dc_m (S P)^T in fp64. diffs: M tensors (n, d) of suspect minus base rows -> (n, L)."""
    weights = key.selector_weights.double()
    total = torch.zeros(diffs[0].shape[0], key.n_lists, dtype=torch.float64)
    for d in diffs:
        d = d.double()
        total += (d - d.mean(0, keepdim=True)) @ weights.T
    return total


def centred_offset_norm2(key: WatermarkKey, rows: torch.Tensor) -> float:
    """||Wc||_F^2: the key's offset on ``rows`` (long (n,)), centred over them."""
    offset = key.delta_w()[rows].double()
    return float((offset - offset.mean(0, keepdim=True)).square().sum())


def weights_test(
    diffs: list[torch.Tensor], rows: torch.Tensor, key: WatermarkKey, n_permutations: int = 9999, tail: bool = True
) -> WeightsStatistic:
    """The statistic, share and p-value of the suspect's differences ``diffs`` (M tensors (n, d)) on the base's
    rows ``rows`` (long (n,), indices into the key's vocabulary)."""
    c = coefficients(diffs, key)
    green = key.green[rows].double()  # (n, L); never-green rows are all False
    statistic = key.delta * float((green * c).sum())
    eligible = green.new_ones(len(rows), dtype=torch.bool)
    eligible[torch.isin(rows, torch.tensor(key.never_green, dtype=torch.long))] = False
    expected = key.delta * key.gamma * float(c[eligible].sum())
    norm2 = len(diffs) * centred_offset_norm2(key, rows)
    p_perm = permutation_pvalue(green.T @ c, statistic, key, n_permutations)
    p_tail = None
    if tail:
        terms = TailTerms(statistic - expected, c[eligible], 0.0, 0.0)
        p_tail = chernoff_pvalue(terms, key.delta, key.gamma)
    return WeightsStatistic(
        statistic=statistic,
        expected=expected,
        share=statistic / norm2 if norm2 > 0 else 0.0,
        offset_norm2=norm2,
        p_permutation=p_perm,
        p_tail=p_tail,
        p_value=combined_pvalue(p_perm, n_permutations, p_tail),
        n_permutations=n_permutations,
    )


def permutation_pvalue(
    cross: torch.Tensor, statistic: float, key: WatermarkKey, n_permutations: int, perms: torch.Tensor | None = None
) -> float:
    """(1 + #{T_pi >= T}) / (K + 1), T_pi = delta sum_l cross[pi(l), l]. cross: G^T C, fp64 (L, L). ``perms``: the
    key's K permutations (K, L) when the caller already drew them (many suspects, one key)."""
    if n_permutations < 1:
        raise ValueError("the permutation test needs at least one permutation")
    if perms is None:
        perms = permutations(key.secret, key.n_lists, n_permutations)  # (K, L)
    lists = torch.arange(key.n_lists)
    permuted = key.delta * cross[perms, lists[None, :]].sum(-1)  # (K,)
    # ties within rounding count as reaching T (conservative): the base itself gives T = T_pi = 0 exactly
    tolerance = 1e-9 * max(abs(statistic), float(permuted.abs().max()), 1e-30)
    return (1 + int((permuted >= statistic - tolerance).sum())) / (n_permutations + 1)
