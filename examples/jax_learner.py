"""A JAX learner on aiocollect: a JAX policy collects, a jitted JAX update learns (REINFORCE).

The policy is a ``JaxPolicy`` (a small MLP sampling from its logits, with a PRNG key that
the policy threads itself); batches reach JAX through ``to_jax`` without a copy; the
learner is a jitted REINFORCE step with a baseline and optax's Adam; new params go back to
the collector with ``update_policy_weights_(params)``, versioned and without waiting.

    python examples/jax_learner.py                 # CartPole-v1, until a mean return of 200
    python examples/jax_learner.py --frames 8192   # a smoke run
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

from aiocollect import Collector
from aiocollect.jax import JaxPolicy, to_jax


def init_params(key: jax.Array, sizes=(4, 64, 2)) -> list[dict]:
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (a, b)) * (1 / np.sqrt(a)), "b": jnp.zeros(b)}
            for k, a, b in zip(keys, sizes, sizes[1:])]


def logits_of(params: list[dict], obs: jax.Array) -> jax.Array:
    x = obs
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            x = jnp.tanh(x)
    return x


def act(params: list[dict], key: jax.Array, obs: jax.Array) -> jax.Array:
    return jax.random.categorical(key, logits_of(params, obs))


def discounted_returns(reward: jax.Array, done: jax.Array, gamma: float) -> jax.Array:
    """Reward-to-go within each episode, for ``[envs, T]`` arrays (the batch's tail is cut)."""
    def step(carry, x):
        r, d = x
        carry = r + gamma * carry * (1.0 - d)
        return carry, carry

    _, out = jax.lax.scan(step, jnp.zeros(reward.shape[0]), (reward.T[::-1], done.T[::-1]))
    return out[::-1].T


optimizer = optax.adam(1e-2)


@jax.jit
def update(params, opt_state, data):
    obs = data["observation"]
    action = data["action"]
    reward = data["next"]["reward"][..., 0]
    done = data["next"]["done"][..., 0].astype(jnp.float32)
    ret = discounted_returns(reward, done, 0.99)
    adv = (ret - ret.mean()) / (ret.std() + 1e-8)

    def loss(p):
        logp = jax.nn.log_softmax(logits_of(p, obs))
        chosen = jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return -(chosen * adv).mean()

    grads = jax.grad(loss)(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400_000, help="give up after this many frames")
    parser.add_argument("--target", type=float, default=200.0, help="stop at this mean episode length")
    args = parser.parse_args()

    params = init_params(jax.random.key(0))
    opt_state = optimizer.init(params)
    fpb = 16 * 128
    collector = Collector([lambda: gym.make("CartPole-v1")] * 16, JaxPolicy(act, params, key=1),
                          frames_per_batch=fpb, total_frames=-(-args.frames // fpb) * fpb)
    collector.set_seed(0)
    start, frames = time.perf_counter(), 0
    for i, batch in enumerate(collector):
        frames += batch.numel()
        data = to_jax(batch)  # shares the batch's memory
        done = np.asarray(data["next"]["done"]).sum()
        length = batch.numel() / max(done, 1)
        print(f"batch {i:3d}  frames {frames:7,d}  mean episode length {length:6.1f}  "
              f"{frames / (time.perf_counter() - start):7,.0f} frames/s", flush=True)
        if length >= args.target:
            break
        params, opt_state = update(params, opt_state, data)
        collector.update_policy_weights_(params)
    collector.shutdown()
    print(f"done after {frames:,} frames in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
