"""The LLM policy over options: backbone loading, per-agent LoRA adapters, prompts, menu scoring, and the
batched lockstep play of LLM teams over the option runner (`play`: training rollouts, evaluations, audits).

Paper concept: each agent's policy is one small frozen base LLM plus a private LoRA adapter
for that agent. A decision shows the game rules, the agent's text view and the guarded menu
of option texts; the policy is a categorical distribution over that menu computed from the
LLM's logits, so every choice is valid and its log-probability is exact:

    pi_i(k | s) = softmax_k( score_i(prompt(s), option_k) )      over the K options of the menu

Two scorings, both exact and differentiable with respect to the agents' LoRA weights:

- ``text`` (default, GLAM-style; Carta et al. 2023): score = per-token MEAN log-likelihood of
  the option's text as the continuation of the prompt's assistant turn. The option tokens are
  ``tokenize(option_text) + [end marker]``, where the end marker is the tokenizer's EOS
  (``<|im_end|>`` for SmolLM2) when it has a chat template and a newline otherwise, so
  "push box 2" and "push box 2 north" are different continuations. The mean, not the sum,
  because summed scores are length-biased (a one-token ``wait`` starts at p ~ 1).
- ``label``: each option is shown with a single-token label and the score is the next-token
  logit of that label after the prompt (one forward, ``logits_to_keep=1``). Labels are tied to
  option IDENTITY, not menu position (position letters collapse under RL): an option's label
  is ``LABEL_POOL[sha256(text) % len(pool)]``; collisions inside one menu are resolved by
  linear probing over the options in sorted text order, so labels depend only on the SET of
  options, never on their order.

Speed (the LLM forward is the cost on CPU): identical (agent, prompt, menu) decisions are
scored once; each decision is one packed row ``[prompt, option_1, ..., option_K]`` with a
tree-shaped attention mask (every option sees the prompt and itself, never another option)
and position ids that restart after the prompt for each option, so the prompt is encoded
once per decision; rows of many decisions, of different agents, go in one left-padded batch
through peft's mixed-adapter forward (``adapter_names``, ``"__base__"`` = adapters off).
``naive_menu_log_probs`` is the one-option-at-a-time reference the packed scorer is tested
against.

Training cost (``lora_layers=k``): with adapters only in the top k of n decoder layers, the bottom
n - k layers (the "trunk") compute the same thing for every agent and for the frozen base. Scoring
with a ``trunk_cache`` dict stores each decision's trunk output (the input hidden states of layer
n - k, one (T, H) tensor per distinct prompt + menu) the first time it is scored, and every later
scoring of that prompt + menu (the update's base pass, its gradient passes) runs only the top k
layers on the cached states. Rollouts fill the cache; the update then costs ~k / n of a full pass.

Notes for callers: the model stays in eval mode (peft refuses mixed-adapter batches in train
mode; LoRA dropout defaults to 0 anyway), and gradients flow through eval mode. Log-probs are
float32 whatever the backbone dtype; in bfloat16 the packed and naive scorers agree only to
~0.05 in log-prob (different summation orders), so old and new log-probs of a GRPO ratio must
both come from ``menu_log_probs``. With a bfloat16 base, peft keeps the LoRA weights in float32.

Test: ``HF_HUB_OFFLINE=1 pytest -q test_all.py -k policy`` (uses the random ``tiny`` preset).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import re
import string
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.profiler import record_function

import envs
import options as options_lib
import plumbing

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LABEL_POOL = tuple(string.ascii_uppercase + string.ascii_lowercase)  # filtered to single tokens
SCORINGS = ("text", "label")


def parse_lora_targets(text: str) -> tuple[str, ...]:
    """'all' (every attention and MLP projection) or comma-separated module names."""
    return LORA_TARGETS if text == "all" else tuple(t.strip() for t in text.split(",") if t.strip())
BASE = "__base__"  # peft's name for "no adapter" rows in a mixed-adapter batch


# ----------------------------------------------------------------------------- backbone loading


# ----------------------------------------------------------------------------- decisions and labels


@dataclass(frozen=True)
class Decision:
    """One choice to score: which adapter, the full prompt text and the menu of option texts."""

    adapter: str | None  # the deciding agent's adapter name, e.g. "agent0"; None = the frozen base (adapters off)
    prompt: str  # full prompt text as returned by MenuPolicy.build_prompt
    menu: tuple[str, ...]  # option texts

    def __post_init__(self):
        object.__setattr__(self, "menu", tuple(self.menu))  # a list menu would not be hashable


def agent_names(n_agents: int) -> list[str]:
    """The adapter name of each agent: agent i (0-based; "agent 1" in text) decides with adapter "agent{i}"."""
    return [f"agent{i}" for i in range(n_agents)]


def option_labels(menu: list[str] | tuple[str, ...], pool: tuple[str, ...]) -> list[str]:
    """Label of each option: pool[sha256(text) % len(pool)], collisions probed in sorted text order."""
    distinct = sorted(set(menu))
    if len(distinct) > len(pool):
        raise ValueError(f"menu has {len(distinct)} distinct options but the label pool only {len(pool)}")
    taken: dict[str, str] = {}  # label -> option text
    label_of: dict[str, str] = {}
    for text in distinct:  # sorted, so the result does not depend on menu order
        slot = int(hashlib.sha256(text.encode()).hexdigest(), 16) % len(pool)
        while pool[slot] in taken:  # linear probing: deterministic collision resolution
            slot = (slot + 1) % len(pool)
        taken[pool[slot]] = text
        label_of[text] = pool[slot]
    return [label_of[text] for text in menu]


# ----------------------------------------------------------------------------- the policy


class MenuPolicy:
    """One base LLM with one private LoRA adapter per agent; a categorical policy over option menus.

    The wrapped model is always in eval mode (dropout off, and peft allows mixed-adapter batches
    only in eval mode); gradients still flow when ``menu_log_probs(..., grad=True)``, and every
    forward's activations then stay alive until ``backward``, so call it per minibatch. One
    forward holds at most ``max_batch_tokens`` padded tokens. The policy takes ownership of
    ``model``: peft injects the LoRA layers into it in place.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, agents: list[str],
                 lora_rank: int = 16, lora_alpha: float = 32,
                 lora_targets: tuple[str, ...] | str = LORA_TARGETS, lora_layers: int = 0,
                 scoring: str = "text", seed: int = 0, max_batch_tokens: int = 4096, list_menu: bool = False):
        from peft import LoraConfig, get_peft_model

        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        if not agents or len(set(agents)) != len(agents) or BASE in agents:
            raise ValueError(f"agents must be distinct adapter names (not {BASE!r}), got {agents}")
        self.tokenizer, self.agents, self.scoring, self.list_menu = tokenizer, list(agents), scoring, list_menu
        self.max_batch_tokens = max_batch_tokens  # padded tokens per forward: bounds activation memory
        self.tokens_processed = 0  # real (non-pad) tokens fed through the model so far
        self.chat = getattr(tokenizer, "chat_template", None) is not None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if self.chat and tokenizer.eos_token_id is not None:
            self.end_ids = [tokenizer.eos_token_id]  # option ends the assistant turn
        else:
            self.end_ids = tokenizer("\n", add_special_tokens=False).input_ids  # option ends the line
        self.label_pool = tuple(x for x in LABEL_POOL if len(self._ids(x)) == 1)
        # the packed tree mask replaces the model's own masks, sliding-window ones included (gemma3: 512)
        self.sliding_window = getattr(model.config, "sliding_window", None)
        self._option_ids: dict[str, list[int]] = {}
        n_layers = model.config.num_hidden_layers
        if lora_layers < 0:
            raise ValueError(f"lora_layers must be >= 0 (0 or >= {n_layers}: every layer), got {lora_layers}")
        lora_layers = 0 if lora_layers >= n_layers else lora_layers  # the whole stack: no trunk
        # adapting only the top k layers: the layers below carry no autograd graph and compute the same
        # for every agent and the base, so the update can replay their cached output (see trunk_cache)
        top = list(range(n_layers - lora_layers, n_layers)) if lora_layers else None
        config = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=list(lora_targets)
                            if not isinstance(lora_targets, str) else lora_targets,
                            layers_to_transform=top, lora_dropout=0.0, bias="none")  # eval mode always
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            torch.manual_seed(seed)  # LoRA A matrices are random; B = 0, so every agent starts as the base
            warnings.simplefilter("ignore", FutureWarning)  # peft 0.21 calls a deprecated transformers API
            self.peft = get_peft_model(model, config, adapter_name=self.agents[0])
            for agent in self.agents[1:]:
                self.peft.add_adapter(agent, config)
        self.peft.eval()
        self._make_adapters_trainable()
        self.trunk = n_layers - lora_layers if lora_layers else 0  # layers below the adapters (0: none)
        self.layers = None  # the decoder layers (nn.ModuleList), needed only to replay a trunk
        if self.trunk:
            self.layers = getattr(getattr(self.peft.get_base_model(), "model", None), "layers", None)
            if not isinstance(self.layers, torch.nn.ModuleList):
                raise ValueError(f"lora_layers={lora_layers} needs a decoder stack at model.model.layers, which "
                                 f"{type(model).__name__} lacks; use lora_layers=0 (every layer)")

    def _make_adapters_trainable(self) -> None:
        # peft marks only the ACTIVE adapter trainable; every agent's adapter must take gradients.
        for agent in self.agents:
            for parameter in self.agent_parameters(agent):
                parameter.requires_grad_(True)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    # ------------------------------------------------------------------ prompts

    def build_prompt(self, system: str, view: str, menu: list[str]) -> str:
        """Chat-formatted prompt (system = rules; user = view [+ menu]) ending where the answer starts.

        In text mode the menu is not listed by default (`list_menu=False`): every option is scored as a
        continuation anyway, and the listing would more than double the prompt (the cost on CPU)."""
        if self.scoring == "label":
            lines = [f"{label}: {text}" for label, text in zip(option_labels(menu, self.label_pool), menu)]
            user = f"{view}\nOptions:\n" + "\n".join(lines) + "\nAnswer with the letter of one option."
        elif self.list_menu:
            user = f"{view}\nOptions:\n" + "\n".join(f"- {text}" for text in menu) + "\nChoose one option."
        else:
            user = f"{view}\nChoose your next option."
        if self.chat:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{system}\n\n{user}\nAnswer:\n"  # base models: the answer continues on the next line

    def tokenize_decision(self, decision: Decision) -> tuple[list[int], list[list[int]]]:
        """(prompt ids, per-option target ids): option text + end marker (text) or its label (label)."""
        if not decision.menu:
            raise ValueError("a decision needs a non-empty menu")
        # a chat template writes its own special tokens; a plain prompt gets the tokenizer's BOS
        prompt_ids = self.tokenizer(decision.prompt, add_special_tokens=not self.chat).input_ids
        if self.scoring == "label":
            return prompt_ids, [self._ids(x) for x in option_labels(decision.menu, self.label_pool)]
        if len(self._option_ids) > 100_000:  # option texts repeat a lot; bound the cache anyway
            self._option_ids.clear()
        options = []
        for text in decision.menu:
            if text not in self._option_ids:
                self._option_ids[text] = self._ids(text) + self.end_ids
            options.append(self._option_ids[text])
        return prompt_ids, options

    # ------------------------------------------------------------------ scoring

    def menu_log_probs(self, decisions: list[Decision], grad: bool = False,
                       trunk_cache: dict | None = None) -> list[torch.Tensor]:
        """log pi(. | decision) over each menu: a (K_i,) float32 tensor whose logsumexp is 0.

        trunk_cache (used only when adapters sit in the top layers, lora_layers > 0): a dict the caller
        keeps; decisions whose prompt + menu it holds run only the layers above the trunk, the others
        are scored in full and their trunk output is stored in it."""
        if self.peft.training:  # mixed-adapter batches need eval mode; it also keeps dropout off
            self.peft.eval()
        unique: dict[Decision, int] = {}  # identical decisions are scored once
        for decision in decisions:
            if decision.adapter is not None and decision.adapter not in self.agents:
                raise ValueError(f"unknown agent {decision.adapter!r}; agents: {self.agents}")
            unique.setdefault(decision, len(unique))
        rows = [(decision, *self.tokenize_decision(decision)) for decision in unique]
        lengths = [len(p) + (sum(map(len, o)) if self.scoring == "text" else 0) for _, p, o in rows]
        use_cache = trunk_cache is not None and self.trunk > 0
        cached = [use_cache and (d.prompt, d.menu) in trunk_cache for d, _, _ in rows]
        results: list[torch.Tensor | None] = [None] * len(rows)
        with torch.set_grad_enabled(grad):
            for replay in (False, True):  # rows scored in full (filling the cache), then cached rows
                todo = [i for i in range(len(rows)) if cached[i] == replay]
                todo.sort(key=lambda i: -lengths[i])  # similar lengths share a batch
                start = 0
                while start < len(todo):  # greedy chunks of at most max_batch_tokens padded tokens
                    stop, longest = start + 1, lengths[todo[start]]
                    while stop < len(todo) and (stop - start + 1) * longest <= self.max_batch_tokens:
                        stop += 1
                    chunk = [rows[i] for i in todo[start:stop]]
                    trunk = [trunk_cache[(d.prompt, d.menu)] for d, _, _ in chunk] if replay else None
                    scores, outputs = self._score_batch(chunk, trunk, capture=use_cache and not replay)
                    for i, logp in zip(todo[start:stop], scores):
                        results[i] = logp
                    for (d, _, _), hidden in zip(chunk, outputs):
                        trunk_cache[(d.prompt, d.menu)] = hidden
                    start = stop
        return [results[unique[decision]] for decision in decisions]

    @contextlib.contextmanager
    def _head_detached(self):
        """The model's forward returns its final (normed) hidden states: lm_head is an identity (and
        final-logit soft-capping off) inside; yields the real head, which `_logits` applies."""
        base = self.peft.get_base_model()
        head, cap = base.lm_head, getattr(base.config, "final_logit_softcapping", None)
        base.lm_head = torch.nn.Identity()
        if cap is not None:
            base.config.final_logit_softcapping = None
        try:
            yield head
        finally:
            base.lm_head = head
            if cap is not None:
                base.config.final_logit_softcapping = cap

    def _logits(self, head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The model's own output logits for given final hidden states (..., H) -> (..., V)."""
        logits = head(hidden)
        cap = getattr(self.peft.get_base_model().config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    @contextlib.contextmanager
    def _trunk(self, replay: torch.Tensor | None, capture: bool):
        """Replay given trunk outputs (the bottom layers return them instead of computing), or capture
        the trunk's output (the input of layer `trunk`); yields a list that receives the capture."""
        captured: list[torch.Tensor] = []
        if replay is not None:
            bottom = [self.layers[i] for i in range(self.trunk)]
            stand_in = _Replay(replay)
            for i in range(self.trunk):
                self.layers[i] = stand_in
            try:
                yield captured
            finally:
                for i, layer in enumerate(bottom):
                    self.layers[i] = layer
        elif capture:
            def hook(module, args, kwargs):
                captured.append((args[0] if args else kwargs["hidden_states"]).detach())
            handle = self.layers[self.trunk].register_forward_pre_hook(hook, with_kwargs=True)
            try:
                yield captured
            finally:
                handle.remove()
        else:
            yield captured

    def _score_batch(self, rows: list[tuple[Decision, list[int], list[list[int]]]],
                     trunk: list[torch.Tensor] | None = None,
                     capture: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One packed, left-padded forward for a batch of distinct decisions.

        Returns (log pi over each menu, each row's trunk output (T_b, H) if capture else []). trunk: the
        rows' cached trunk outputs, replayed instead of running the bottom layers."""
        device = self.peft.get_input_embeddings().weight.device
        text = self.scoring == "text"
        # Each row packs its prompt and, after it, its menu as a token tree: options that begin with the same
        # tokens share those positions ("push box 1 north" and "push box 1 south" share "push box 1"), so a
        # shared prefix runs through the layers and the head once. Exact: a tree token attends to the prompt and
        # to its own ancestors only, at the position it has in its option (restarting after the prompt).
        packed = []  # per row: (ids, position, parent, paths); parent: the packed index a token continues
        for _, prompt, options in rows:
            ids, position, parent, paths = list(prompt), list(range(len(prompt))), list(range(-1, len(prompt) - 1)), []
            child: dict[tuple[int, int], int] = {}  # (parent index, token) -> packed index of that tree node
            for option in options if text else []:
                at, path = len(prompt) - 1, []
                for depth, token in enumerate(option):
                    if (at, token) not in child:
                        child[at, token] = len(ids)
                        ids.append(token)
                        position.append(len(prompt) + depth)
                        parent.append(at)
                    at = child[at, token]
                    path.append(at)
                paths.append(path)
            packed.append((ids, position, parent, paths))
        width = max(len(ids) for ids, _, _, _ in packed)  # T
        longest = max(max(position) for _, position, _, _ in packed) + 1  # longest prompt + option
        if self.sliding_window and longest > self.sliding_window:
            raise ValueError(f"prompt + option of {longest} tokens exceeds the backbone's sliding attention "
                             f"window ({self.sliding_window}), which the packed mask does not model")
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (B, T)
        positions = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
        # Tree mask: a prompt token sees the prompt up to itself; a tree token sees the prompt and its ancestors.
        # Padding queries see themselves only (keeps softmax finite; never read).
        allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # (B, T, T)
        for b, (ids, position, parent, _) in enumerate(packed):  # left padding: rows end together
            n, pad, prompt_length = len(ids), width - len(ids), len(rows[b][1])
            input_ids[b, pad:] = torch.tensor(ids)
            positions[b, pad:] = torch.tensor(position)
            sees = np.zeros((n, n), dtype=bool)
            sees[:prompt_length, :prompt_length] = np.tril(np.ones((prompt_length, prompt_length), dtype=bool))
            for i in range(prompt_length, n):
                sees[i] = sees[parent[i]]
                sees[i, i] = True
            allowed[b, pad:, pad:] = torch.from_numpy(sees)
        dtype = self.peft.get_input_embeddings().weight.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        # logits only where they are read: the last prompt token and every tree token
        keep = max(len(ids) - len(prompt) + 1 for (ids, _, _, _), (_, prompt, _) in zip(packed, rows)) if text else 1
        replay = None
        if trunk is not None:  # cached trunk outputs, left-padded like the ids: (B, T, H)
            replay = torch.zeros((len(rows), width, trunk[0].shape[-1]), dtype=trunk[0].dtype, device=device)
            for b, hidden in enumerate(trunk):
                replay[b, width - len(hidden):] = hidden
        else:
            self.tokens_processed += sum(len(ids) for ids, _, _, _ in packed)
        # The vocabulary projection is the dominant cost of scoring option texts (tens of option tokens a
        # decision, 49k-way normalization each): the model returns its final hidden states (head
        # detached), and the head runs below only at the distinct positions whose predictions are read.
        with self._trunk(replay, capture) as captured, self._head_detached() as head, record_function("layers"):
            hidden = self.peft(
                input_ids=input_ids.to(device), attention_mask=mask[:, None].to(device),  # (B, 1, T, T)
                position_ids=positions.to(device), logits_to_keep=keep, use_cache=False,
                adapter_names=[BASE if d.adapter is None else d.adapter for d, _, _ in rows],
            ).logits  # (B, keep, H): the normed final hidden states, not logits
        # each row's trunk output without its left padding
        outputs = [captured[0][b, width - len(ids):].clone() for b, (ids, _, _, _) in enumerate(packed)] if capture \
            else []
        if not text:  # label: next-token logits restricted to the menu's labels
            logits = self._logits(head, hidden[:, -1])  # (B, V)
            label_ids = [torch.tensor([o[0] for o in options], device=device) for _, _, options in rows]
            return [torch.log_softmax(logits[b, ids].float(), dim=-1) for b, ids in enumerate(label_ids)], outputs
        # text: token t of an option is predicted by the hidden state of its parent in the tree (the last prompt
        # token for t = 0); a parent shared by several options is read once
        where, position_of, target_of, option_of = [], [], [], []  # where: (row, column) read; rest per token
        option_id = 0  # global index of an option across the batch
        first = width - keep  # absolute position of kept column 0
        for b, ((ids, _, parent, paths), (_, _, options)) in enumerate(zip(packed, rows)):
            pad, slot = width - len(ids), {}  # slot: packed index of a parent -> its index in `where`
            for path, option in zip(paths, options):
                for node, token in zip(path, option):
                    if parent[node] not in slot:
                        slot[parent[node]] = len(where)
                        where.append((b, pad + parent[node] - first))
                    position_of.append(slot[parent[node]])
                    target_of.append(token)
                    option_of.append(option_id)
                option_id += 1
        menu_sizes = [len(options) for _, _, options in rows]
        tensor = functools.partial(torch.tensor, device=device)
        read = tensor(where)  # (U, 2)
        with record_function("head"):
            logits = self._logits(head, hidden[read[:, 0], read[:, 1]])  # (U, V)
            # log p(token) = logit(token) - logsumexp(logits), in float32
            log_normalizer = torch.logsumexp(logits.float(), dim=-1)  # (U,)
            slots = tensor(position_of)  # (N,) one per option token
            token_logp = logits[slots, tensor(target_of)].float() - log_normalizer[slots]  # (N,)
        option_index, n_options = tensor(option_of), sum(menu_sizes)
        total = torch.zeros(n_options, device=device).index_add(0, option_index, token_logp)  # (O,)
        count = torch.zeros(n_options, device=device).index_add(0, option_index, torch.ones_like(token_logp))
        score = total / count  # per-token mean log-likelihood of each option
        return [torch.log_softmax(s, dim=-1) for s in torch.split(score, menu_sizes)], outputs  # over the menu

    # ------------------------------------------------------------------ acting

    def sample(self, decisions: list[Decision], temperature: float,
               generator: torch.Generator) -> tuple[list[int], list[torch.Tensor]]:
        """Draw one option per decision from softmax(log pi / temperature); 0 = greedy.

        Returns the chosen indices and the untempered log pi over each menu (the policy's own
        log-probabilities, which the GRPO ratio uses).
        """
        log_probs = self.menu_log_probs(decisions, grad=False)
        if temperature <= 0:
            return [int(torch.argmax(lp)) for lp in log_probs], log_probs  # argmax: ties -> lowest index
        chosen = []
        for lp in log_probs:  # in decision order, so one generator state gives one trajectory
            probs = torch.softmax(lp.cpu() / temperature, dim=-1)
            chosen.append(int(torch.multinomial(probs, 1, generator=generator)))
        return chosen, log_probs

    def greedy(self, decisions: list[Decision]) -> list[int]:
        """The most probable option of each menu (ties -> lowest index)."""
        return [int(torch.argmax(lp)) for lp in self.menu_log_probs(decisions, grad=False)]

    # ------------------------------------------------------------------ adapters

    def agent_parameters(self, agent: str) -> list[torch.nn.Parameter]:
        """That agent's LoRA matrices only (what its optimizer updates)."""
        if agent not in self.agents:
            raise ValueError(f"unknown agent {agent!r}; agents: {self.agents}")
        return [p for name, p in self.peft.named_parameters() if "lora_" in name and f".{agent}." in name]

    def save_adapters(self, folder: str) -> None:
        """folder/<agent>/adapter_config.json + adapter_model.safetensors (standard peft format)."""
        # peft writes an adapter not named "default" to folder/<name>/ (plus a README.md model card)
        self.peft.save_pretrained(folder, selected_adapters=self.agents)

    def load_adapters(self, folder: str) -> None:
        """Load every agent's adapter from folder (as written by save_adapters); all or nothing."""
        from safetensors.torch import load_file

        staged = []
        for agent in self.agents:
            where = Path(folder) / agent
            config = self.peft.peft_config[agent]
            try:
                saved = json.loads((where / "adapter_config.json").read_text())
                tensors = load_file(where / "adapter_model.safetensors")
            except Exception as error:  # missing file, bad JSON, corrupt safetensors
                raise plumbing.ModelError(f"cannot read adapter {where} ({type(error).__name__}: "
                                 f"{str(error).splitlines()[0] if str(error) else ''})") from error
            if saved.get("r") != config.r or saved.get("lora_alpha") != config.lora_alpha or \
                    set(saved.get("target_modules") or []) != set(config.target_modules):
                raise plumbing.ModelError(f"adapter {where} has r={saved.get('r')} alpha={saved.get('lora_alpha')} "
                                 f"targets={saved.get('target_modules')}; this policy has r={config.r} "
                                 f"alpha={config.lora_alpha} targets={sorted(config.target_modules)}")
            params = {name: p for name, p in self.peft.named_parameters()
                      if "lora_" in name and f".{agent}." in name}
            # peft saves keys without the adapter name: '...q_proj.lora_A.weight'
            wanted = {re.sub(rf"\.{re.escape(agent)}\.", ".", name): p for name, p in params.items()}
            if set(tensors) != set(wanted) or any(tensors[k].shape != wanted[k].shape for k in tensors):
                raise plumbing.ModelError(f"adapter {where} does not match this backbone "
                                 f"({len(tensors)} tensors saved, {len(wanted)} expected or shapes differ)")
            staged += [(wanted[k], tensors[k]) for k in tensors]
        with torch.no_grad():  # copy in place: optimizers keep pointing at the same parameters
            for parameter, value in staged:
                parameter.copy_(value)


class _Replay(torch.nn.Module):
    """Stands in for a trunk decoder layer: returns the cached trunk output, computes nothing."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden

    def forward(self, hidden_states, *args, **kwargs):
        return self.hidden


@contextlib.contextmanager
def _only_adapter(policy: MenuPolicy, agent: str | None):
    """Activate one agent's adapter (or none) for a plain forward; restore trainability after."""
    if agent is None:
        try:
            with policy.peft.disable_adapter():
                yield
        finally:  # leaving disable_adapter() makes only the active adapter trainable again
            policy._make_adapters_trainable()
        return
    previous = policy.peft.active_adapter
    policy.peft.set_adapter(agent)
    try:
        yield
    finally:
        policy.peft.set_adapter(previous)
        policy._make_adapters_trainable()  # set_adapter froze every other adapter


def naive_menu_log_probs(policy: MenuPolicy, decision: Decision) -> torch.Tensor:
    """Reference scorer: one full (prompt + option) sequence per forward, no packing, cache or batch."""
    prompt, options = policy.tokenize_decision(decision)
    device = policy.peft.get_input_embeddings().weight.device
    with torch.no_grad(), _only_adapter(policy, decision.adapter):
        if policy.scoring == "label":
            logits = policy.peft(input_ids=torch.tensor([prompt], device=device)).logits[0, -1]  # (V,)
            return torch.log_softmax(logits[[o[0] for o in options]].float(), dim=-1)
        scores = []
        for option in options:
            ids = torch.tensor([prompt + option], device=device)  # (1, P + L)
            # logits of the last L + 1 positions only (the trunk still runs the full sequence)
            logits = policy.peft(input_ids=ids, logits_to_keep=len(option) + 1).logits[0]  # (L + 1, V)
            logits = logits.float()
            token_logp = torch.log_softmax(logits[:-1], dim=-1)  # position t predicts token t + 1
            scores.append(token_logp.gather(1, ids[0, len(prompt):, None]).mean())  # per-token mean
        return torch.log_softmax(torch.stack(scores), dim=-1)


# ----------------------------------------------------------------------------- acting: batched play over the runner
# The lockstep loop every LLM team plays through: training rollouts (pamagrpo.py), evaluations and the audits
# (audit.py) all sit on it, so the audits never import the algorithm.


EVAL_ITERATION = 1 << 30  # the "iteration" of evaluation sampling seeds, apart from any training one


@dataclass
class Step:
    """One decision of one agent in one rollout."""

    rollout: int
    agent: int
    t: int  # primitive step at which the chosen option started
    decision: Decision
    choice: int
    old_logp: torch.Tensor  # (K,) log-probabilities over the menu when it was sampled (rollout batch)
    ret: float = 0.0  # credited return R_d
    advantage: float = 0.0


def check_finite(what: str, values: torch.Tensor | list[torch.Tensor] | float) -> None:
    if isinstance(values, float):
        ok = math.isfinite(values)
    else:
        values = values if isinstance(values, list) else [values]
        ok = all(bool(torch.isfinite(v).all()) for v in values)
    if not ok:
        raise plumbing.NonFiniteError(f"{what} is not finite (NaN or inf)")


def sampling_generator(seed: int, iteration: int, start: int, rollout: int) -> torch.Generator:
    """A generator that depends only on (seed, iteration, start state, rollout): never on batching or rank."""
    mixed = np.random.SeedSequence([seed, iteration, start, rollout]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(mixed))


def sample_choice(logp: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """Sample from softmax(logp / T); T == 0 is greedy (lowest index on ties). The log-probs leave the policy's
    device as CPU float64 first, so the CPU generator never meets a GPU tensor and the same log-probs give the
    same choice on any device."""
    logp = logp.detach().to("cpu", torch.float64)  # (K,)
    if temperature <= 0:
        return int(torch.argmax(logp))
    probs = torch.softmax(logp / temperature, dim=0)
    return int(torch.multinomial(probs, 1, generator=generator))


def play(games: list[envs.Game], seeds: list[int], library: options_lib.Library, menu_filter, policy: MenuPolicy,
         agents: list[str | None], temperature: float | list[float], generators: list[torch.Generator],
         trunk_cache: dict | None = None):
    """Play one episode per game in lockstep, batching every pending decision of every rollout into one
    scoring call. agents[i]: adapter name of agent i, None for the frozen base, or a `choose(runner,
    agent, menu)` function (a scripted stand-in, not recorded as a step). temperature: one for every rollout, or
    one per rollout (0: greedy). trunk_cache: filled with every decision's trunk output for the update (see
    policy.py). Returns (runners, steps)."""
    temperatures = temperature if isinstance(temperature, list) else [temperature] * len(games)
    runners = []
    for game, seed in zip(games, seeds):
        game.reset(seed)
        runners.append(options_lib.Runner(game, library, menu_filter))
    steps: list[Step] = []
    while True:
        pending = [(r, i) for r, run in enumerate(runners) for i in run.pending()]
        if not pending:  # every runner was advanced until a decision or its end: all have ended
            return runners, steps
        for r, i in [(r, i) for r, i in pending if callable(agents[i])]:  # scripted stand-ins (audits)
            runners[r].assign(i, agents[i](runners[r], i, runners[r].menu(i)))
        pending = [(r, i) for r, i in pending if not callable(agents[i])]
        menus, decisions = [], []
        for r, i in pending:
            menu = runners[r].menu(i)
            view, texts = options_lib.observation(runners[r], i, menu)
            prompt = policy.build_prompt(runners[r].game.rules, view, texts)
            menus.append(menu)
            decisions.append(Decision(agents[i], prompt, tuple(texts)))
        logps = policy.menu_log_probs(decisions, trunk_cache=trunk_cache) if decisions else []
        for decision, logp in zip(decisions, logps):
            check_finite(f"a menu log-probability of {decision.adapter or 'the frozen base'}", logp)
        for (r, i), menu, decision, logp in zip(pending, menus, decisions, logps):
            choice = sample_choice(logp, temperatures[r], generators[r])
            steps.append(Step(r, i, runners[r].game.t, decision, choice, logp))
            runners[r].assign(i, menu[choice])
        for run in runners:
            if not run.pending():
                run.advance()


def episodes(runners: list[options_lib.Runner]) -> list[options_lib.Episode]:
    """The runners' episodes in the shape options.run_episode returns (for audit.py)."""
    return [options_lib.Episode(r.game.total_reward, r.game.score, r.game.t, r.executions, r.events, [])
            for r in runners]


def llm_choose(policy: MenuPolicy, agent_name: str | None):
    """A greedy LLM agent as an options.run_episode `choose` function (one decision at a time; audits)."""
    def choose(runner, agent, menu):
        view, texts = options_lib.observation(runner, agent, menu)
        decision = Decision(agent_name, policy.build_prompt(runner.game.rules, view, texts), tuple(texts))
        return menu[int(torch.argmax(policy.menu_log_probs([decision])[0]))]
    return choose
