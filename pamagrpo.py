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
   `shaping` w > 0, r_t = team reward + w x the game's shaped reward of step t (kitchen: an onion in a pot and a
   plated soup as in Overcooked-AI, a useful dish by envs.Kitchen's rule; train.py anneals w to 0); scores never
   use it.
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

Symbols -> names (the hyperparameters are the fields of `Config`): B `start_states`, G `group_size`,
T `temperature`, w `shaping`, gamma `gamma`, eps `clip_eps`, R_d `step.ret`, A_d `step.advantage`, rho_d `ratio`,
pi_old `old`, pi_base `base`, H `entropy`, |D_i| `count`. The loss of one decision is `decision_loss`.

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
  policy's own loops get negative advantages; train.py's default is one per group of four, chosen over
  seeds: results/README.md) and a decaying temperature (train.py `--temperature-decay`);
- with adapters only in the top layers (`lora_layers`), the update replays the rollouts' cached trunk
  outputs instead of recomputing the frozen bottom layers (identical math, a fraction of the cost);
- under torchrun, ranks split the start states (whole groups) and sum each agent's gradient before its
  step, so the update equals the single-process one up to summation order.

Needs: options (the runner and Task), policy (the LLM policy and `play`, the lockstep loop that rollouts,
evaluations and audits share), plumbing (the collective helpers, no-ops in one process).
Test: `HF_HUB_OFFLINE=1 pytest -q test_all.py -k "hand_computed_loss or decision_loss or kl_and_entropy or
credit or advantages or align or temperature"`: update()'s gradient, KL and entropy against the equation
above computed by hand on the tiny model, credit and advantages against hand-written numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

import options
import plumbing
from policy import Decision, MenuPolicy, Step, check_finite, episodes, eval_play, play, sampling_generator


@dataclass
class Config:
    """The algorithm's hyperparameters, named as in the docstring (train.py's Args embeds them as flags)."""

    start_states: int = 2  # B: start states per iteration (fresh each iteration, from the training split)
    group_size: int = 4  # G: rollouts per start state; usually 4 to 16
    temperature: float = 1.0  # T: sampling temperature of the rollouts, > 0 (1: on-policy; otherwise off-policy)
    greedy_rollouts: int = 1  # rollouts of each group played greedily (T = 0; off-policy), chosen over 5 seeds
    credit: str = "to_go"  # R_d: to_go (return-to-go) | episode | to_go_aligned (minus the group's same-step mean)
    gamma: float = 1.0  # discount of the credited return (1: none; < 1 prefers faster rollouts), in (0, 1]
    shaping: float = 0.0  # w: kitchen: weight of its shaped rewards (envs.Kitchen), linearly to 0 at the last iteration
    advantage: str = "per_agent"  # per_agent (PA-MAGRPO) | shared (MAGRPO baseline, the ablation)
    clip_eps: float = 0.2  # eps: PPO clip range of the ratio; usually 0.1 to 0.3
    kl_coef: float = 0.05  # weight of the exact KL(pi_i || pi_base) over the menu
    entropy_coef: float = 0.0  # weight of an entropy bonus (0: none)
    epochs: int = 1  # optimizer steps per agent per iteration, each on all its decisions (PPO-style epochs)
    minibatch: int = 32  # decisions per forward in the update (bounds memory; gradients accumulate)
    max_grad_norm: float = 1.0  # gradient-norm clip of each adapter
    lr: float = 1e-3  # AdamW learning rate of each adapter; usually 3e-4 to 1e-3 (top-layer adapters)


def returns_to_go(rewards: list[float], gamma: float) -> list[float]:
    """G_t = sum_{t' >= t} gamma^(t' - t) r_t' for every step t, and G_T = 0 past the last step."""
    out = [0.0] * (len(rewards) + 1)
    for t in range(len(rewards) - 1, -1, -1):
        out[t] = rewards[t] + gamma * out[t + 1]
    return out


def credit(steps: list[Step], runners: list[options.Runner], max_reward: float, mode: str,
           group_of: list[int] | None = None, gamma: float = 1.0, shaping: float = 0.0) -> None:
    """Set each step's credited return R_d (docstring step 2): the return-to-go from its start step ("to_go"),
    the episode return ("episode"), or the return-to-go minus the mean return-to-go of its group's rollouts
    from the same step ("to_go_aligned"). gamma < 1 discounts rewards by their distance from the decision
    (from step 0 for "episode"). shaping w > 0 adds w x the game's shaped reward of each step."""
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


def advantages(steps: list[Step], group_of: list[int], mode: str, eps: float = 1e-6) -> tuple[int, int]:
    """Set each step's advantage A_d (docstring step 3). Returns (zero-spread units, units), where a unit is an
    (agent, group) pair ("per_agent") or a group ("shared"); the counts add up over ranks."""
    zero, total = 0, 0
    agents = [None] if mode == "shared" else sorted({st.agent for st in steps})
    for s in sorted(set(group_of)):
        for i in agents:  # PA-MAGRPO: agent i's own decisions in group s; MAGRPO ("shared"): all of them
            mine = [st for st in steps if group_of[st.rollout] == s and i in (None, st.agent)]
            if not mine:
                continue
            rets = np.array([st.ret for st in mine])
            mean, std = rets.mean(), rets.std()
            total += 1
            zero += std < eps
            for st in mine:
                st.advantage = 0.0 if std < eps else float((st.ret - mean) / (std + eps))
    return zero, total


def decision_loss(logp: torch.Tensor, old_logp: torch.Tensor, base_logp: torch.Tensor, choice: int,
                  advantage: float, cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decision's term of L_i (docstring step 4), before the mean over D_i; logp, old_logp, base_logp: (K,)
    log pi_i, log pi_old and log pi_base over its menu. Returns (loss, kl, entropy, ratio)."""
    ratio = torch.exp(logp[choice] - old_logp[choice])  # rho_d
    surrogate = -torch.min(ratio * advantage, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * advantage)
    p = logp.exp()
    kl = torch.sum(p * (logp - base_logp))  # exact KL(pi_i || pi_base) over the menu
    entropy = -torch.sum(p * logp)
    return surrogate + cfg.kl_coef * kl - cfg.entropy_coef * entropy, kl, entropy, ratio


def update(policy: MenuPolicy, optimizers: dict[str, torch.optim.Optimizer], steps: list[Step], cfg: Config,
           order_seed: int, trunk_cache: dict | None = None) -> dict[str, float]:
    """The clipped, KL-regularized per-agent update: `epochs` optimizer steps per agent, each on the
    gradient of that agent's loss over ALL its decisions (accumulated over memory-sized minibatches).

    Because no parameter moves within an epoch, the first epoch's forward IS pi_old: the old log-probs
    are that forward detached, computed in exactly the batches the later epochs use (a decision's
    log-prob depends slightly on its batch in bfloat16, and the ratio must start at exactly 1).
    Returns flat per-agent metrics."""
    names = sorted(optimizers)
    # pi_base over each menu, once (the base is frozen); with a trunk cache it runs only the top layers
    base = policy.menu_log_probs([Decision(None, s.decision.prompt, s.decision.menu) for s in steps],
                                 trunk_cache=trunk_cache)
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
            new = policy.menu_log_probs([steps[k].decision for k in batch], grad=True, trunk_cache=trunk_cache)
            if epoch == 0:
                old.update((k, logp.detach()) for k, logp in zip(batch, new))
            terms = []
            for k, logp in zip(batch, new):  # logp: (K,) over this decision's menu
                st, n = steps[k], steps[k].decision.adapter
                loss, kl, entropy, ratio = decision_loss(logp, old[k], base[k], st.choice, st.advantage, cfg)
                terms.append(loss / count[n])  # L_i is a mean over D_i
                loss_sum[n] += float(terms[-1].detach())
                if epoch == cfg.epochs - 1:  # report the policy as it stands before the last step
                    stats[n]["kl"].append(float(kl.detach()))
                    stats[n]["entropy"].append(float(entropy.detach()))
                    stats[n]["clip"].append(float(abs(float(ratio.detach()) - 1) > cfg.clip_eps))
            # summing agents is safe: agent n's adapter only receives gradient from agent n's rows
            torch.stack(terms).sum().backward()
        for n in names:
            if not count[n]:
                continue
            plumbing.all_reduce_gradients(policy.agent_parameters(n))  # the whole iteration's gradient on every rank
            norm = torch.nn.utils.clip_grad_norm_(policy.agent_parameters(n), cfg.max_grad_norm)
            check_finite(f"{n}'s gradient norm", float(norm))  # a NaN or inf anywhere upstream never reaches a weight
            optimizers[n].step()
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


def iteration(policy: MenuPolicy, optimizers: dict[str, torch.optim.Optimizer], task: options.Task,
              seeds: list[int], it: int, cfg: Config, seed: int) -> dict[str, float]:
    """One PA-MAGRPO iteration from the start states `seeds` (the docstring's steps 1-4); returns its metrics.
    cfg holds this iteration's values (train.py's schedules set cfg.temperature and cfg.shaping).

    Under torchrun each rank plays the groups of its share of `seeds` (whole groups, so advantages stay
    local) and the update all-reduces gradients; the metrics are gathered from every rank."""
    t0, tokens0 = time.perf_counter(), policy.tokens_processed
    # 1. group rollouts: G rollouts from each start state, the first `greedy_rollouts` of each group greedy
    seeds = plumbing.my_share(seeds)
    n_rollouts = len(seeds) * cfg.group_size
    rollout_seeds = [seeds[r // cfg.group_size] for r in range(n_rollouts)]
    group_of = [r // cfg.group_size for r in range(n_rollouts)]
    gens = [sampling_generator(seed, it, rollout_seeds[r], r % cfg.group_size) for r in range(n_rollouts)]
    trunk_cache: dict = {}  # (prompt, menu) -> trunk output, reused by the update (lora_layers > 0)
    temperatures = [0.0 if r % cfg.group_size < cfg.greedy_rollouts else cfg.temperature for r in range(n_rollouts)]
    runners, steps = play(task, rollout_seeds, policy, sorted(optimizers), temperatures, gens, trunk_cache)
    t_rollout = time.perf_counter() - t0
    # 2. credit: each decision's (shaped, discounted) return R_d
    credit(steps, runners, runners[0].game.max_reward, cfg.credit, group_of, cfg.gamma, cfg.shaping)
    # 3. per-agent advantages A_d
    zero, units = advantages(steps, group_of, cfg.advantage)
    # 4. per-agent update of each adapter
    metrics = update(policy, optimizers, steps, cfg, order_seed=seed * 1_000_003 + it, trunk_cache=trunk_cache)
    scores = plumbing.all_gather([run.game.score for run in runners])
    raw = plumbing.all_gather([run.game.total_reward for run in runners])
    lengths = plumbing.all_gather([run.game.t for run in runners])
    zero, units = np.sum(plumbing.all_gather([(zero, units)]), axis=0)
    elapsed = time.perf_counter() - t0
    out = {"iteration": it, "rollout/return_mean": float(np.mean(raw)), "rollout/return_std": float(np.std(raw)),
           "rollout/score_mean": float(np.mean(scores)), "rollout/zero_std_groups": float(zero / max(units, 1)),
           "rollout/temperature": cfg.temperature, "rollout/shaping": cfg.shaping,
           "rollout/decisions": sum(plumbing.all_gather([len(steps)])),
           "rollout/episode_steps": float(np.mean(lengths)),
           "time/rollout_s": t_rollout, "time/update_s": elapsed - t_rollout, "time/iteration_s": elapsed,
           "time/tokens": sum(plumbing.all_gather([policy.tokens_processed - tokens0]))}
    out.update({f"train/{k}": v for k, v in metrics.items()})
    return out


def evaluate(policy: MenuPolicy, task: options.Task, seeds: list[int], agents: list[str | None],
             temperature: float = 0.0, seed: int = 0, episodes_out: list | None = None) -> dict[str, float]:
    """Greedy (T = 0) or sampled evaluation on fixed seeds: mean normalized score and return. Under
    torchrun the seeds are split across ranks and the results gathered. episodes_out: receives this rank's
    episodes (policy.episodes), e.g. for the final audit's intact team."""
    runners, steps = eval_play(policy, task, plumbing.my_share(seeds), agents, seed, temperature)
    if episodes_out is not None:
        episodes_out.extend(episodes(runners))
    scores = plumbing.all_gather([run.game.score for run in runners])
    entropies = plumbing.all_gather([float(-(s.old_logp.exp() * s.old_logp).sum()) for s in steps])
    return {"score": float(np.mean(scores)), "score_std": float(np.std(scores)),
            "return": float(np.mean(plumbing.all_gather([run.game.total_reward for run in runners]))),
            "decisions": len(entropies), "entropy": float(np.mean(entropies)) if entropies else math.nan}
