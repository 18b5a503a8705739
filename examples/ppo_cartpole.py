"""PPO on gymnasium's CartPole-v1, in one file, with its advantages computed by ``gae_xp.gae`` on torch tensors.

    pip install ".[examples]"                   # gymnasium, torch, matplotlib
    python examples/ppo_cartpole.py             # trains until the last 100 episodes average >= 475, prints the times
    python examples/ppo_cartpole.py --plot curve.png   # the same, and draws the learning curve into curve.png
    python examples/ppo_cartpole.py --smoke     # a few updates: finite losses, gae_xp equals the loop (CI)

The PPO is CleanRL's ``ppo.py`` (the same network, losses and hyperparameters), with what CleanRL's version
leaves out made explicit:

* vectorised envs with gymnasium >= 1.0's autoreset ("next step"): the step that ends an episode returns the
  episode's *final* observation, and the next call to ``step`` resets that env, ignores its action and returns
  reward 0. That reset step is no transition: it is masked out of GAE (``mask``) and out of the losses.
* terminated and truncated kept apart: a pole that falls (terminated) has no future value; an episode cut at
  500 steps (truncated) is bootstrapped with V(final observation). Since the final observation is the next
  observation of the done step, ``next_values[t] = V(obs[t + 1])`` holds for every step, done or not.

So the advantages are one call::

    advantages, returns = gae_xp.gae(rewards, values, next_values=next_values, terminated=terminated,
                                     truncated=truncated, mask=real, gamma=0.99, lam=0.95, axis=0)

and after every rollout the script also runs CleanRL's loop (its recurrence, with the terminated/truncated
split) on the same tensors, timing both. The run stops when the mean return of the last 100 episodes reaches
475 (CartPole-v1's reward threshold), or at ``--total-timesteps``; it then prints the times, and with
``--plot PATH`` draws the learning curve. One torch thread, torch's deterministic algorithms; ``--seed`` seeds
torch, numpy and the envs. A run is repeatable on one machine (the same CPU and the same torch, numpy and
gymnasium): the same seed gives the same episodes, steps and returns. Another CPU may not: torch's float kernels
take other paths there (vector width, fused multiply-adds), their last bits differ, and training, which amplifies
them, follows another course to the threshold.
"""

from __future__ import annotations

import argparse
import collections
import math
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

import gae_xp
from gae_xp.adapters.cleanrl import normalize_advantages

SOLVED = 475.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="seed of torch, numpy and the envs (default: 1)")
    parser.add_argument("--num-envs", type=int, default=8, help="vectorised CartPole envs (default: 8)")
    parser.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout (default: 128)")
    parser.add_argument("--total-timesteps", type=int, default=500_000, help="env steps at most (default: 500000)")
    parser.add_argument("--learning-rate", type=float, default=2.5e-4, help="Adam's, annealed to 0 (default: 2.5e-4)")
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--plot", default=None, help="write the learning curve to this PNG (needs matplotlib)")
    parser.add_argument("--smoke", action="store_true",
                        help="3 updates; assert finite losses and gae_xp == CleanRL's loop on every rollout")
    args = parser.parse_args(argv)
    if args.smoke:
        args.total_timesteps = 3 * args.num_envs * args.num_steps
    return args


def layer_init(layer, std=math.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """CleanRL's: two tanh MLPs of 64 units, orthogonal initialisation."""

    def __init__(self, observations: int, actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(observations, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 64)), nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(observations, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, actions), std=0.01))

    def value(self, obs):
        return self.critic(obs).squeeze(-1)

    def act(self, obs, action=None):
        distribution = Categorical(logits=self.actor(obs))
        if action is None:
            action = distribution.sample()
        return action, distribution.log_prob(action), distribution.entropy(), self.value(obs)


def cleanrl_loop(rewards, values, next_values, terminated, truncated, gamma, lam):
    """CleanRL's GAE loop over the rollout, time-major, with terminated and truncated kept apart."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):
        nextnonterminal = 1.0 - terminated[t].float()
        nextnotdone = 1.0 - (terminated[t] | truncated[t]).float()
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnotdone * lastgaelam
    return advantages


def collect(envs, agent, obs, autoreset, episode, returns_so_far, steps):
    """One rollout of ``steps`` steps per env (gymnasium's next-step autoreset), time-major tensors."""
    n = envs.num_envs
    buffers = {"obs": torch.zeros((steps, n, *envs.single_observation_space.shape)),
               "actions": torch.zeros((steps, n), dtype=torch.long), "logprobs": torch.zeros((steps, n)),
               "values": torch.zeros((steps, n)), "rewards": torch.zeros((steps, n)),
               "terminated": torch.zeros((steps, n), dtype=torch.bool),
               "truncated": torch.zeros((steps, n), dtype=torch.bool),
               "real": torch.zeros((steps, n), dtype=torch.bool)}
    for step in range(steps):
        with torch.no_grad():
            action, logprob, _, value = agent.act(obs)
        next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
        buffers["obs"][step], buffers["actions"][step], buffers["logprobs"][step] = obs, action, logprob
        buffers["values"][step], buffers["rewards"][step] = value, torch.from_numpy(reward)
        buffers["terminated"][step] = torch.from_numpy(terminated)
        buffers["truncated"][step] = torch.from_numpy(truncated)
        buffers["real"][step] = torch.from_numpy(~autoreset)  # a reset step is no transition
        returns_so_far += np.where(autoreset, 0.0, reward)
        autoreset = terminated | truncated
        for env in np.flatnonzero(autoreset):
            episode.append(float(returns_so_far[env]))
            returns_so_far[env] = 0.0
        obs = torch.from_numpy(next_obs)
    with torch.no_grad():
        next_value = agent.value(obs)
    # The observation after step t is obs[t + 1] (the final one at a done step): V(s_{t+1}) for every step.
    buffers["next_values"] = torch.cat([buffers["values"][1:], next_value[None]])
    return buffers, obs, autoreset


def warm_up(args):
    """One call of gae on a rollout's shapes before training: numba compiles (or loads from its cache) here."""
    steps, n = args.num_steps, args.num_envs
    zeros, flags = torch.zeros((steps, n)), torch.zeros((steps, n), dtype=torch.bool)
    began = time.perf_counter()
    gae_xp.gae(zeros, zeros, next_values=zeros, terminated=flags, truncated=flags, mask=~flags, axis=0)
    return time.perf_counter() - began


def update(agent, optimizer, data, advantages, returns, args):
    """CleanRL's PPO update (clipped surrogate, clipped value loss, entropy bonus) over the real steps only."""
    real = data["real"].reshape(-1)
    flat = {k: v.reshape(-1, *v.shape[2:])[real] for k, v in data.items() if k not in ("real", "next_values")}
    b_advantages, b_returns = advantages.reshape(-1)[real], returns.reshape(-1)[real]
    losses = []
    for _ in range(args.update_epochs):
        # The real steps of a rollout vary in number: num_minibatches parts of (nearly) equal size.
        for index in torch.tensor_split(torch.randperm(b_advantages.shape[0]), args.num_minibatches):
            _, logprob, entropy, value = agent.act(flat["obs"][index], flat["actions"][index])
            ratio = (logprob - flat["logprobs"][index]).exp()
            mb_advantages = normalize_advantages(b_advantages[index])
            pg_loss = torch.max(-mb_advantages * ratio,
                                -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
            old_value = flat["values"][index]
            clipped = old_value + torch.clamp(value - old_value, -args.clip_coef, args.clip_coef)
            v_loss = 0.5 * torch.max((value - b_returns[index]) ** 2, (clipped - b_returns[index]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
    return losses


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    envs = gym.make_vec("CartPole-v1", num_envs=args.num_envs, vectorization_mode="vector_entry_point")
    agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    obs = torch.from_numpy(envs.reset(seed=args.seed)[0])
    autoreset = np.zeros(args.num_envs, dtype=bool)
    returns_so_far = np.zeros(args.num_envs)
    episodes, curve = [], []  # every episode's return; (env steps, mean of the last 100) after each update
    timings = collections.defaultdict(float)
    timings["first gae_xp.gae call (compiles)"] = warm_up(args)
    updates = args.total_timesteps // (args.num_envs * args.num_steps)
    start = time.perf_counter()
    for iteration in range(1, updates + 1):
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / updates) * args.learning_rate
        data, obs, autoreset = collect(envs, agent, obs, autoreset, episodes, returns_so_far, args.num_steps)

        began = time.perf_counter()
        advantages, returns = gae_xp.gae(data["rewards"], data["values"], next_values=data["next_values"],
                                         terminated=data["terminated"], truncated=data["truncated"],
                                         mask=data["real"], gamma=args.gamma, lam=args.gae_lambda, axis=0)
        timings["gae_xp.gae"] += time.perf_counter() - began
        began = time.perf_counter()
        loop = cleanrl_loop(data["rewards"], data["values"], data["next_values"], data["terminated"],
                            data["truncated"], args.gamma, args.gae_lambda)
        timings["CleanRL's loop"] += time.perf_counter() - began
        if args.smoke:
            real = data["real"]
            torch.testing.assert_close(advantages[real], loop[real], rtol=0, atol=1e-5)
            assert bool((advantages[~real] == 0).all()), "reset steps must get no advantage"

        losses = update(agent, optimizer, data, advantages, returns, args)
        if not all(math.isfinite(loss) for loss in losses):
            raise RuntimeError(f"a loss is not finite at update {iteration}: {losses}")
        steps = iteration * args.num_envs * args.num_steps
        recent = float(np.mean(episodes[-100:])) if episodes else 0.0
        curve.append((steps, recent))
        if iteration % 20 == 0 or args.smoke:
            print(f"update {iteration:4d}  steps {steps:7d}  episodes {len(episodes):5d}  "
                  f"mean return (last 100) {recent:6.1f}  loss {losses[-1]:+.3f}", flush=True)
        if not args.smoke and len(episodes) >= 100 and recent >= SOLVED:
            break
    wall = time.perf_counter() - start
    envs.close()
    report(args, episodes, curve, timings, iteration, wall)
    if args.plot:
        plot(args.plot, episodes, curve, args.seed, wall)
    return 0 if args.smoke or curve[-1][1] >= SOLVED else 1


def report(args, episodes, curve, timings, iterations, wall):
    steps, recent = curve[-1]
    print(f"{'smoke run' if args.smoke else 'run'}: seed {args.seed}, {iterations} updates, {steps} env steps, "
          f"{len(episodes)} episodes, mean return of the last 100: {recent:.1f} "
          f"({'solved' if recent >= SOLVED else 'not solved'}: >= {SOLVED:g}), wall time {wall:.1f} s")
    ours, theirs = timings["gae_xp.gae"], timings["CleanRL's loop"]
    print(f"advantages on {iterations} rollouts of {args.num_steps} x {args.num_envs}: gae_xp.gae {ours * 1e3:.1f} ms "
          f"({ours / iterations * 1e6:.0f} us per rollout), CleanRL's loop {theirs * 1e3:.1f} ms "
          f"({theirs / iterations * 1e6:.0f} us per rollout): {theirs / ours:.1f}x; the first gae_xp.gae call, "
          f"before training, took {timings['first gae_xp.gae call (compiles)']:.2f} s (numba compiles or loads)")


def plot(path, episodes, curve, seed, wall):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, recent = zip(*curve)
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(steps, recent, label="mean return of the last 100 episodes")
    axes.axhline(SOLVED, color="grey", linestyle="--", label=f"CartPole-v1 solved ({SOLVED:g})")
    axes.set_xlabel("env steps")
    axes.set_ylabel("episodic return")
    axes.set_title(f"PPO on CartPole-v1, advantages by gae_xp.gae (seed {seed}, {len(episodes)} episodes, "
                   f"{wall:.0f} s)", fontsize=10)
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"learning curve written to {path}")


if __name__ == "__main__":
    raise SystemExit(main())
