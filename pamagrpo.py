"""PA-MAGRPO: per-agent multi-agent GRPO over option menus.

Each agent i has its own LoRA adapter (policy pi_i, see policy.py). One iteration:

1. Group rollouts. B start states (seeds s); from each, G rollouts of the asynchronous option runner,
   every agent sampling from its guarded menu at temperature T. Rollouts of a group share the start
   state and differ only by sampling; sampling seeds derive from (seed, iteration, start state, rollout).
2. Credit. Decision d of agent i in rollout g is credited with the team's normalized return
   R_d = sum_{t >= t_d} r_t / R_max (the return-to-go from the decision's start step t_d; `credit="episode"`
   uses the whole episode return instead; `credit="to_go_aligned"` subtracts the group's mean
   return-to-go from the same step, R_d - mean_{g' in s} sum_{t >= t_d} r^{g'}_t / R_max, so that in long
   episodes with several rewards early decisions are not favored merely for coming early). A discount
   `gamma` < 1 weighs r_t by gamma^(t - t_d), which prefers the faster of rollouts that all succeed. With
   `shaping` w > 0, r_t = team reward + w x the game's shaped reward of step t (kitchen: Overcooked-AI's
   rewards for an onion in a pot, a useful dish, a plated soup; train.py anneals w to 0); scores never use it.
3. Per-agent advantages (Dr. MAS style). For agent i and group s, over agent i's own decisions D_{i,s}:
       A_d = (R_d - mean_{D_{i,s}} R) / (std_{D_{i,s}} R + eps)
   Agents make different numbers of decisions (options are asynchronous), so their statistics differ.
   `advantage="shared"` is the MAGRPO baseline: one mean and std over all of group s's decisions, both
   agents pooled, the same for every agent (with `credit="episode"`, the G rollouts' returns weighted by
   their decision counts). A group with zero spread gives zero advantage.
4. Per-agent loss over agent i's decisions, with rho_d = pi_i(o_d | h_d) / pi_old(o_d | h_d):
       L_i = mean_d[ -min(rho_d A_d, clip(rho_d, 1 - eps, 1 + eps) A_d) ]
             + kl_coef * mean_d KL(pi_i(.|h_d) || pi_base(.|h_d))  -  entropy_coef * mean_d H(pi_i(.|h_d))
   The KL is exact: the menu is a small categorical distribution. pi_base is the same model with adapters
   disabled. One AdamW optimizer per agent over that agent's adapter only, gradient-norm clipping.

What the default update is. With the default `epochs=1`, pi_old is the policy being differentiated, so
rho_d = 1 and the clip never binds: the update is plain on-policy policy gradient, the gradient of
-mean_d A_d log pi_i(o_d | h_d), with per-agent group-normalized advantages, plus the gradient of the exact
KL (and of the entropy bonus if `entropy_coef` > 0). The clip engages only with `epochs` > 1, where epochs
after the first reuse the same decisions after the policy has moved. The rollouts are sampled from
softmax(log pi / T) while rho_d and the loss use the untempered pi_i, so at a sampling temperature T != 1
the update is off-policy (no importance correction for T; T = 1 is the on-policy case).

Symbols -> names: B `start_states`, G `group_size`, T `temperature`, R_d `returns`, A_d `advantages`,
gamma `gamma`, rho_d `ratio`, eps `clip_eps`, pi_old `old`, pi_base `base`, H `entropy`, |D_i| `count`.

Departures from GRPO (Shao et al. 2024) and MAGRPO:
- the "completion" is one option choice from a menu; its probability is exact (normalized over the menu);
- per-agent normalization (above) instead of one group baseline shared by all agents (kept as a flag);
- return-to-go credit by default (options make an episode a sequence of decisions, not one completion),
  optionally with a time-aligned group baseline (`to_go_aligned`, the kitchen preset);
- KL to the frozen base computed exactly over the menu instead of a sampled k3 estimator;
- both agents' losses are summed into one mixed-adapter backward pass (an agent's LoRA weights get
  gradient only from its own decisions), then each agent's optimizer steps on its own adapter;
- one optimizer step per agent per epoch on the whole iteration's decisions (minibatches only bound
  memory and accumulate gradient), so pi_old is the first epoch's own forward and needs no extra pass;
  with `epochs=1` the ratio is exactly 1 and the clip never binds (on-policy policy gradient, above);
- rollouts sampled at temperature T != 1 are treated as if drawn from pi_i (no correction: off-policy); so
  are greedy rollouts (`greedy_rollouts` > 0: the first k of each group play the argmax, so the greedy
  policy's own loops get negative advantages; train.py's default is one per group of four, chosen over 5
  seeds in results/recipes-plan.md) and a decaying temperature (train.py `--temperature-decay`);
- with adapters only in the top layers (`lora_layers`), the update replays the rollouts' cached trunk
  outputs instead of recomputing the frozen bottom layers (identical math, a fraction of the cost);
- under torchrun, ranks split the start states (whole groups) and sum each agent's gradient before its
  step, so the update equals the single-process one up to summation order.

Test: `HF_HUB_OFFLINE=1 pytest -q test_all.py -k "hand_computed_loss or kl_and_entropy or credit or
advantages or align or temperature"`: update()'s gradient, KL and entropy against the equation above computed
by hand on the tiny model, credit and advantages against hand-written numbers, decision times in play()
(policy.play: the lockstep loop the rollouts, evaluations and audits share).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import record_function

import options
import plumbing
from policy import EVAL_ITERATION, Decision, MenuPolicy, Step, check_finite, episodes, play, sampling_generator


# ----------------------------------------------------------------------------- data parallel (torchrun)
# Under torchrun every rank holds the base and all adapters and plays a share of the start states; these
# helpers are no-ops in a single process, so the algorithm below has one code path.


def returns_to_go(rewards: list[float], gamma: float) -> list[float]:
    """G_t = sum_{t' >= t} gamma^(t' - t) r_t' for every step t, and G_T = 0 past the last step."""
    out = [0.0] * (len(rewards) + 1)
    for t in range(len(rewards) - 1, -1, -1):
        out[t] = rewards[t] + gamma * out[t + 1]
    return out


def credit(steps: list[Step], runners: list[options.Runner], max_reward: float, mode: str,
           group_of: list[int] | None = None, gamma: float = 1.0, shaping: float = 0.0) -> None:
    """Set each step's credited return: the return-to-go from its start step ("to_go"), the episode return
    ("episode"), or the return-to-go minus the mean return-to-go of its group's rollouts from the same step
    ("to_go_aligned": a time-aligned group baseline, so a decision is not credited for how early it came).
    gamma < 1 discounts rewards by their distance from the decision (from step 0 for "episode"), so that
    among rollouts that all succeed the faster ones are preferred. shaping > 0 adds the game's shaped reward
    of each step times `shaping` to its reward (r_t + w s_t; kitchen's Overcooked-AI shaping)."""
    rewards = [run.rewards if not shaping else [r + shaping * s for r, s in zip(run.rewards, run.shaping)]
               for run in runners]
    to_go = [returns_to_go(r, gamma) for r in rewards]

    def at(r: int, t: int) -> float:  # rollout r's return-to-go from step t (0 once it has ended)
        return to_go[r][min(t, len(to_go[r]) - 1)]

    for step in steps:
        total = at(step.rollout, 0 if mode == "episode" else step.t)
        if mode == "to_go_aligned":
            peers = [r for r in range(len(runners)) if group_of[r] == group_of[step.rollout]]
            total -= float(np.mean([at(r, step.t) for r in peers]))
        step.ret = total / max_reward


def advantages(steps: list[Step], group_of: list[int], mode: str, eps: float = 1e-6) -> float:
    """Fill step.advantage; returns the fraction of zero-spread (agent, group) pairs (or groups, shared)."""
    zero, total = advantage_counts(steps, group_of, mode, eps)
    return zero / max(total, 1)


def advantage_counts(steps: list[Step], group_of: list[int], mode: str, eps: float = 1e-6) -> tuple[int, int]:
    """advantages(), returning (zero-spread units, units): the counts add up over ranks."""
    zero, total = 0, 0
    groups = sorted(set(group_of))
    if mode == "shared":  # MAGRPO: one baseline per group over all its decisions, the same for every agent
        for s in groups:
            mine = [st for st in steps if group_of[st.rollout] == s]
            rets = np.array([st.ret for st in mine])
            mean, std = rets.mean(), rets.std()
            total += 1
            zero += std < eps
            for st in mine:
                st.advantage = 0.0 if std < eps else float((st.ret - mean) / (std + eps))
        return zero, total
    for s in groups:  # PA-MAGRPO: agent i's statistics over agent i's own decisions in group s
        for i in sorted({st.agent for st in steps}):
            mine = [st for st in steps if st.agent == i and group_of[st.rollout] == s]
            if not mine:
                continue
            rets = np.array([st.ret for st in mine])
            mean, std = rets.mean(), rets.std()
            total += 1
            zero += std < eps
            for st in mine:
                st.advantage = 0.0 if std < eps else float((st.ret - mean) / (std + eps))
    return zero, total


@dataclass
class UpdateConfig:
    clip_eps: float = 0.2
    kl_coef: float = 0.05
    entropy_coef: float = 0.0
    epochs: int = 1
    minibatch: int = 32
    max_grad_norm: float = 1.0


def update(policy: MenuPolicy, optimizers: dict[str, torch.optim.Optimizer], steps: list[Step],
           cfg: UpdateConfig, order_seed: int, trunk_cache: dict | None = None) -> dict[str, float]:
    """The clipped, KL-regularized per-agent update: `epochs` optimizer steps per agent, each on the
    gradient of that agent's loss over ALL its decisions (accumulated over memory-sized minibatches).

    Because no parameter moves within an epoch, the first epoch's forward IS pi_old: the old log-probs
    are that forward detached, computed in exactly the batches the later epochs use (a decision's
    log-prob depends slightly on its batch in bfloat16, and the ratio must start at exactly 1).
    Returns flat per-agent metrics."""
    names = sorted(optimizers)
    # pi_base over each menu, once (the base is frozen); with a trunk cache it runs only the top layers
    with record_function("update: base pass"):  # named scopes: bench.py --only train profiles by them
        base = policy.menu_log_probs([Decision(None, s.decision.prompt, s.decision.menu) for s in steps],
                                     trunk_cache=trunk_cache)
    check_finite("a frozen-base menu log-probability", base)
    # |D_i| over all ranks: each L_i is a mean over agent i's decisions of the whole iteration
    count = {n: sum(plumbing.all_gather([sum(s.decision.adapter == n for s in steps)])) for n in names}
    stats = {n: {"kl": [], "clip": [], "entropy": [], "grad_norm": [], "loss": []} for n in names}
    order = np.random.default_rng(order_seed).permutation(len(steps))
    batches = [[int(k) for k in order[i:i + cfg.minibatch]] for i in range(0, len(steps), cfg.minibatch)]
    old: dict[int, torch.Tensor] = {}  # pi_old, filled by the first epoch
    for epoch in range(cfg.epochs):
        for n in names:
            optimizers[n].zero_grad(set_to_none=True)
        loss_sum = {n: 0.0 for n in names}
        for batch in batches:
            with record_function("update: gradient pass"):
                new = policy.menu_log_probs([steps[k].decision for k in batch], grad=True, trunk_cache=trunk_cache)
            if epoch == 0:
                old.update((k, logp.detach()) for k, logp in zip(batch, new))
            terms = []
            for k, logp in zip(batch, new):  # logp: (K,) over this decision's menu
                st = steps[k]
                n = st.decision.adapter
                ratio = torch.exp(logp[st.choice] - old[k][st.choice])  # rho_d (exactly 1 in epoch 0)
                adv = st.advantage
                surrogate = -torch.min(ratio * adv, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
                p = logp.exp()
                kl = torch.sum(p * (logp - base[k]))  # exact KL(pi_i || pi_base) over the menu
                entropy = -torch.sum(p * logp)
                term = (surrogate + cfg.kl_coef * kl - cfg.entropy_coef * entropy) / count[n]  # mean over D_i
                terms.append(term)
                loss_sum[n] += float(term.detach())
                if epoch == cfg.epochs - 1:  # report the policy as it stands before the last step
                    stats[n]["kl"].append(float(kl.detach()))
                    stats[n]["entropy"].append(float(entropy.detach()))
                    stats[n]["clip"].append(float(abs(float(ratio.detach()) - 1) > cfg.clip_eps))
            # summing agents is safe: agent n's adapter only receives gradient from agent n's rows
            loss = torch.stack(terms).sum()
            check_finite("the loss", loss)
            with record_function("update: backward"):
                loss.backward()
        for n in names:
            if not count[n]:
                continue
            plumbing.all_reduce_gradients(policy.agent_parameters(n))  # the whole iteration's gradient on every rank
            norm = torch.nn.utils.clip_grad_norm_(policy.agent_parameters(n), cfg.max_grad_norm)
            check_finite(f"{n}'s gradient norm", float(norm))  # checked before the step, so no weight is hit
            with record_function("update: optimizer"):
                optimizers[n].step()
            check_finite(f"{n}'s adapter weights after the optimizer step", list(policy.agent_parameters(n)))
            stats[n]["grad_norm"].append(float(norm))
            stats[n]["loss"].append(sum(plumbing.all_gather([loss_sum[n]])))
    out = {}
    for n in names:
        for key, values in stats[n].items():
            values = values if key in ("grad_norm", "loss") else plumbing.all_gather(values)  # the rest is per decision
            out[f"{n}.{key}"] = float(np.mean(values)) if values else 0.0
        out[f"{n}.decisions"] = count[n]
    return out


def make_optimizers(policy: MenuPolicy, names: list[str], lr: float) -> dict[str, torch.optim.Optimizer]:
    return {n: torch.optim.AdamW(policy.agent_parameters(n), lr=lr, weight_decay=0.0) for n in names}


def iteration(policy: MenuPolicy, optimizers, game_factory, library, menu_filter, seeds: list[int],
              group_size: int, temperature: float, credit_mode: str, advantage_mode: str, cfg: UpdateConfig,
              seed: int, it: int, gamma: float = 1.0, greedy_rollouts: int = 0,
              shaping: float = 0.0) -> dict[str, float]:
    """One PA-MAGRPO iteration: group rollouts -> credit -> advantages -> per-agent update. Returns metrics.
    greedy_rollouts: the first k rollouts of every group are played greedily (T = 0) instead of sampled.
    shaping: the weight of the game's shaped rewards in the credited returns (0: the team reward alone).

    Under torchrun each rank plays the groups of its share of `seeds` (whole groups, so advantages stay
    local) and the update all-reduces gradients; the metrics are gathered from every rank."""
    t0 = time.perf_counter()
    tokens0 = policy.tokens_processed
    seeds = plumbing.my_share(seeds)
    n_rollouts = len(seeds) * group_size
    games = [game_factory() for _ in range(n_rollouts)]
    rollout_seeds = [seeds[r // group_size] for r in range(n_rollouts)]
    group_of = [r // group_size for r in range(n_rollouts)]
    gens = [sampling_generator(seed, it, rollout_seeds[r], r % group_size) for r in range(n_rollouts)]
    names = sorted(optimizers)
    trunk_cache: dict = {}  # (prompt, menu) -> trunk output, reused by the update (lora_layers > 0)
    temperatures = [0.0 if r % group_size < greedy_rollouts else temperature for r in range(n_rollouts)]
    with record_function("rollout"):
        runners, steps = play(games, rollout_seeds, library, menu_filter, policy, names, temperatures, gens,
                              trunk_cache)
    t_rollout = time.perf_counter() - t0
    max_reward = games[0].max_reward
    credit(steps, runners, max_reward, credit_mode, group_of, gamma, shaping)
    zero, units = advantage_counts(steps, group_of, advantage_mode)
    metrics = update(policy, optimizers, steps, cfg, order_seed=seed * 1_000_003 + it, trunk_cache=trunk_cache)
    scores = plumbing.all_gather([run.game.score for run in runners])
    raw = plumbing.all_gather([run.game.total_reward for run in runners])
    lengths = plumbing.all_gather([run.game.t for run in runners])
    zero, units = np.sum(plumbing.all_gather([(zero, units)]), axis=0)
    elapsed = time.perf_counter() - t0
    out = {"iteration": it, "rollout/return_mean": float(np.mean(raw)), "rollout/return_std": float(np.std(raw)),
           "rollout/score_mean": float(np.mean(scores)), "rollout/zero_std_groups": float(zero / max(units, 1)),
           "rollout/temperature": temperature, "rollout/shaping": shaping,
           "rollout/decisions": sum(plumbing.all_gather([len(steps)])), "rollout/episode_steps": float(np.mean(lengths)),
           "time/rollout_s": t_rollout, "time/update_s": elapsed - t_rollout, "time/iteration_s": elapsed,
           "time/tokens": sum(plumbing.all_gather([policy.tokens_processed - tokens0]))}
    out.update({f"train/{k}": v for k, v in metrics.items()})
    return out


def evaluate(policy: MenuPolicy, game_factory, library, menu_filter, seeds: list[int], agents: list[str | None],
             temperature: float = 0.0, seed: int = 0, episodes_out: list | None = None) -> dict[str, float]:
    """Greedy (T = 0) or sampled evaluation on fixed seeds: mean normalized score and return. Under
    torchrun the seeds are split across ranks and the results gathered. episodes_out: receives this rank's
    episodes (policy.episodes), e.g. for the final audit's intact team."""
    seeds = plumbing.my_share(seeds)
    games = [game_factory() for _ in seeds]
    gens = [sampling_generator(seed, EVAL_ITERATION, s, 0) for s in seeds]
    runners, steps = play(games, seeds, library, menu_filter, policy, agents, temperature, gens)
    if episodes_out is not None:
        episodes_out.extend(episodes(runners))
    scores = plumbing.all_gather([run.game.score for run in runners])
    entropies = plumbing.all_gather([float(-(s.old_logp.exp() * s.old_logp).sum()) for s in steps])
    return {"score": float(np.mean(scores)), "score_std": float(np.std(scores)),
            "return": float(np.mean(plumbing.all_gather([run.game.total_reward for run in runners]))),
            "decisions": len(entropies), "entropy": float(np.mean(entropies)) if entropies else math.nan}

