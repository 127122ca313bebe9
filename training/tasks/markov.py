"""A seeded order-k Markov chain over a small alphabet, whose entropy rate is known exactly.

The chain's state is the last `order` symbols. Each state's next-symbol distribution is drawn from
a symmetric Dirichlet with a low concentration, so most states strongly prefer a few symbols: the
text is learnable, but far from trivial. Sequences start from the stationary distribution, so every
position of every sequence has the same law and the best achievable loss is computable:

- entropy rate  H = sum_s pi(s) * H(P(.|s)), pi the stationary distribution of the k-gram chain,
  found by power iteration in float64;
- a model that sees only t < k earlier symbols cannot know the full state, so the floor of the
  mean loss over a window also counts H(X_t | X_0..X_{t-1}) for those first positions
  (`window_floor`), from the stationary k-gram marginals.
"""

from __future__ import annotations

import numpy as np

_POWER_ITERATION_TOLERANCE = 1e-14
_POWER_ITERATION_LIMIT = 100_000


def _entropy(probabilities: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats along the last axis (0 * log 0 = 0)."""
    safe = np.where(probabilities > 0, probabilities, 1.0)
    return -(probabilities * np.log(safe)).sum(axis=-1)


class MarkovSource:
    """The chain for (`alphabet`, `order`, `concentration`, `seed`); all derived values are exact."""

    def __init__(self, alphabet: int, order: int, concentration: float, seed: int) -> None:
        if alphabet < 2 or order < 1 or concentration <= 0:
            raise ValueError("need alphabet >= 2, order >= 1 and concentration > 0")
        if alphabet**order > 1 << 20:
            raise ValueError(f"alphabet**order = {alphabet**order} states is too many")
        self.alphabet = alphabet
        self.order = order
        self.num_states = alphabet**order
        rng = np.random.default_rng([seed, 0x4D41524B])  # domain tag: "MARK"
        transitions = rng.dirichlet(np.full(alphabet, concentration), size=self.num_states)
        # A Dirichlet draw can underflow to an exact zero; keep every transition possible so the
        # chain is irreducible and aperiodic (the stationary distribution exists and is unique).
        transitions = np.maximum(transitions, 1e-12)
        self.transitions = transitions / transitions.sum(axis=1, keepdims=True)
        self._cumulative = np.cumsum(self.transitions, axis=1)
        self.stationary = self._stationary_distribution()

    def next_state(self, states: np.ndarray, symbols: np.ndarray) -> np.ndarray:
        """The k-gram state after appending `symbols` to `states` (state = base-`alphabet` number)."""
        return (states * self.alphabet + symbols) % self.num_states

    def _stationary_distribution(self) -> np.ndarray:
        pi = np.full(self.num_states, 1.0 / self.num_states)
        all_states = np.arange(self.num_states)
        for _ in range(_POWER_ITERATION_LIMIT):
            nxt = np.zeros_like(pi)
            for symbol in range(self.alphabet):
                targets = self.next_state(all_states, np.full_like(all_states, symbol))
                np.add.at(nxt, targets, pi * self.transitions[:, symbol])
            delta = np.abs(nxt - pi).sum()
            pi = nxt
            if delta < _POWER_ITERATION_TOLERANCE:
                return pi / pi.sum()
        raise ArithmeticError("power iteration did not converge")

    def entropy_rate(self) -> float:
        """sum_s pi(s) H(P(.|s)), in nats per symbol."""
        return float(self.stationary @ _entropy(self.transitions))

    def conditional_entropy(self, history: int) -> float:
        """H(X_t | previous `history` symbols) under the stationary law, in nats."""
        if history >= self.order:
            return self.entropy_rate()
        # Marginal of the last `history + 1` symbols of a stationary state: group the k-gram
        # probabilities by their low-order digits.
        joint = np.bincount(
            np.arange(self.num_states) % self.alphabet ** (history + 1),
            weights=self.stationary,
            minlength=self.alphabet ** (history + 1),
        ).reshape(-1, self.alphabet)
        context = joint.sum(axis=1)
        return float(_entropy(joint.reshape(-1)) - _entropy(context))

    def window_floor(self, length: int) -> float:
        """Best possible mean loss (nats/token) predicting symbols 1..length from their prefix."""
        return float(np.mean([self.conditional_entropy(min(t, self.order)) for t in range(1, length + 1)]))

    def sample(self, rng: np.random.Generator, count: int, length: int) -> np.ndarray:
        """`count` stationary sequences of `length` symbols, int64 (count, length)."""
        states = rng.choice(self.num_states, size=count, p=self.stationary)
        out = np.empty((count, length), dtype=np.int64)
        # Unroll the start state into its symbols, oldest first.
        prefix = min(self.order, length)
        for position in range(prefix):
            out[:, position] = (states // self.alphabet ** (self.order - 1 - position)) % self.alphabet
        uniforms = rng.random((count, length))
        for position in range(self.order, length):
            thresholds = self._cumulative[states]
            symbols = (thresholds < uniforms[:, position, None]).sum(axis=1)
            symbols = np.minimum(symbols, self.alphabet - 1)  # guard cumsum rounding below 1.0
            out[:, position] = symbols
            states = self.next_state(states, symbols)
        return out
