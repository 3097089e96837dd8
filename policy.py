"""The LLM policy over options: one frozen base LLM with a private LoRA adapter per agent, prompts, menu
scoring, and `play`, the lockstep loop of LLM teams over the option runner (rollouts, evaluations, audits).

Paper concept: agent i's policy is the base LLM plus agent i's adapter. A decision shows the game rules, the
agent's text view and the guarded menu of option texts; the policy is a categorical distribution over that
menu computed from the LLM's logits, so every choice is valid and its log-probability is exact:

    pi_i(k | s) = softmax_k( score_i(prompt(s), option_k) )      over the K options of the menu

Two scorings, both exact and differentiable with respect to the agents' LoRA weights:

- ``text`` (default, GLAM-style; Carta et al. 2023): score = per-token MEAN log-likelihood of the option's
  tokens ``tokenize(option_text) + [end marker]`` as the continuation of the prompt's assistant turn. The end
  marker (EOS with a chat template, else a newline) tells "push box 2" from "push box 2 north"; the mean,
  not the sum, because summed scores favour short options.
- ``label``: each option is shown with a single-token label; score = that label's next-token logit. Labels
  follow option IDENTITY, not menu position (position letters collapse under RL): ``LABEL_POOL[sha256(text)
  % len(pool)]``, collisions probed in sorted text order, so they depend only on the SET of options.

``naive_menu_log_probs`` is the definition (one forward per option); ``MenuPolicy.menu_log_probs`` the same, fast:
- identical decisions are scored once; the vocabulary head runs only where a prediction is read;
- a decision is one row, its prompt then its options as a token tree under a tree attention mask (shared
  prefixes encoded once); rows of many decisions and agents share a batch (peft's mixed-adapter forward);
- trunk replay: with adapters in the top k of n layers only (``LoRA(layers=k)``), a ``trunk_cache`` keeps the
  bottom n - k layers' output of each prompt + menu from its first scoring (the rollouts); later scorings (the
  update) run only the top k layers.

Log-probs are float32; in bfloat16 the two scorers sum in different orders: take both of a GRPO ratio from
``menu_log_probs``.

Needs: envs (the game type), options (runner, menus, text views), plumbing (error types).
Test: ``HF_HUB_OFFLINE=1 pytest -q test_all.py -k policy`` (the random ``tiny`` preset), among them
``test_policy_packed_scoring_matches_naive_on_the_first_call`` and ``test_policy_trunk_cache_replays_exactly``.
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

import options as options_lib
import plumbing

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LABEL_POOL = tuple(string.ascii_uppercase + string.ascii_lowercase)  # filtered to single tokens
SCORINGS = ("text", "label")
BASE = "__base__"  # peft's name for "no adapter" rows in a mixed-adapter batch


def parse_lora_targets(text: str) -> tuple[str, ...]:
    """'all' (every attention and MLP projection) or comma-separated module names."""
    return LORA_TARGETS if text == "all" else tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True)
class LoRA:
    """The shape of every agent's adapter (all agents alike)."""

    rank: int = 16  # r: rank of each adapted projection's update B A
    alpha: float = 32.0  # the update is scaled by alpha / r
    targets: tuple[str, ...] = LORA_TARGETS  # module names to adapt (see parse_lora_targets)
    layers: int = 0  # adapt only the top `layers` decoder layers (the rest is a replayable trunk); 0: all


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


# ----------------------------------------------------------------------------- the definition: one option at a time
@contextlib.contextmanager
def _only_adapter(policy: MenuPolicy, agent: str | None):
    """Activate one agent's adapter (or none) for a plain forward; restore trainability after."""
    previous = policy.peft.active_adapter
    try:
        if agent is None:
            with policy.peft.disable_adapter():
                yield
        else:
            policy.peft.set_adapter(agent)
            yield
    finally:  # set_adapter and leaving disable_adapter() leave only the active adapter trainable
        policy.peft.set_adapter(previous)
        policy._make_adapters_trainable()


def naive_menu_log_probs(policy: MenuPolicy, decision: Decision) -> torch.Tensor:
    """log pi(. | decision) as defined: one (prompt + option) forward per option; what menu_log_probs must match."""
    prompt, options = policy.tokenize_decision(decision)
    device = policy.device
    with torch.no_grad(), _only_adapter(policy, decision.adapter):
        if policy.scoring == "label":
            logits = policy.peft(input_ids=torch.tensor([prompt], device=device)).logits[0, -1]  # (V,)
            return torch.log_softmax(logits[[o[0] for o in options]].float(), dim=-1)
        scores = []
        for option in options:
            ids = torch.tensor([prompt + option], device=device)  # (1, P + L)
            logits = policy.peft(input_ids=ids, logits_to_keep=len(option) + 1).logits[0]  # (L + 1, V)
            logits = logits.float()
            token_logp = torch.log_softmax(logits[:-1], dim=-1)  # position t predicts token t + 1
            scores.append(token_logp.gather(1, ids[0, len(prompt):, None]).mean())  # per-token mean
        return torch.log_softmax(torch.stack(scores), dim=-1)


# ----------------------------------------------------------------------------- the policy
class MenuPolicy:
    """One base LLM with one private LoRA adapter per agent; a categorical policy over option menus.

    The model stays in eval mode (no dropout; peft mixes adapters in a batch only in eval mode); with
    ``menu_log_probs(..., grad=True)`` activations live until ``backward``, so call it per minibatch. The policy
    owns ``model``: peft injects the LoRA layers into it in place (float32 on a bfloat16 base)."""

    max_batch_tokens = 4096  # padded tokens per forward: bounds activation memory

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, agents: list[str],
                 lora: LoRA = LoRA(), scoring: str = "text", seed: int = 0):
        from peft import LoraConfig, get_peft_model
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        if not agents or len(set(agents)) != len(agents) or BASE in agents:
            raise ValueError(f"agents must be distinct adapter names (not {BASE!r}), got {agents}")
        self.tokenizer, self.agents, self.scoring = tokenizer, list(agents), scoring
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
        self._option_tokens = functools.lru_cache(maxsize=100_000)(lambda text: self._ids(text) + self.end_ids)
        n_layers = model.config.num_hidden_layers
        if lora.layers < 0:
            raise ValueError(f"LoRA layers must be >= 0 (0 or >= {n_layers}: every layer), got {lora.layers}")
        self.trunk = n_layers - lora.layers if 0 < lora.layers < n_layers else 0  # layers below: replayable
        top = list(range(self.trunk, n_layers)) if self.trunk else None  # None: every layer
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.targets),
                            layers_to_transform=top, lora_dropout=0.0, bias="none")  # eval mode always
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            torch.manual_seed(seed)  # LoRA A matrices are random; B = 0, so every agent starts as the base
            warnings.simplefilter("ignore", FutureWarning)  # peft 0.21 calls a deprecated transformers API
            self.peft = get_peft_model(model, config, adapter_name=self.agents[0])
            for agent in self.agents[1:]:
                self.peft.add_adapter(agent, config)
        self.peft.eval()
        self._make_adapters_trainable()
        self.layers = None  # the decoder layers (nn.ModuleList), needed only to replay a trunk
        if self.trunk:
            self.layers = getattr(getattr(self.peft.get_base_model(), "model", None), "layers", None)
            if not isinstance(self.layers, torch.nn.ModuleList):
                raise ValueError(f"LoRA layers={lora.layers} needs a decoder stack at model.model.layers, which "
                                 f"{type(model).__name__} lacks; use layers=0 (every layer)")

    def _make_adapters_trainable(self) -> None:
        # peft marks only the ACTIVE adapter trainable; every agent's adapter must take gradients.
        for agent in self.agents:
            for parameter in self.agent_parameters(agent):
                parameter.requires_grad_(True)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    @property
    def device(self) -> torch.device:
        return self.peft.get_input_embeddings().weight.device

    # ------------------------------------------------------------------ prompts
    def build_prompt(self, system: str, view: str, menu: list[str]) -> str:
        """Chat prompt (system = rules; user = view [+ labelled menu]) ending where the answer starts. Text
        scoring omits the menu: each option is scored as a continuation; the list would more than double the prompt."""
        if self.scoring == "label":
            lines = [f"{label}: {text}" for label, text in zip(option_labels(menu, self.label_pool), menu)]
            user = f"{view}\nOptions:\n" + "\n".join(lines) + "\nAnswer with the letter of one option."
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
        return prompt_ids, [self._option_tokens(text) for text in decision.menu]

    # ------------------------------------------------------------------ scoring, fast: packed token trees
    def menu_log_probs(self, decisions: list[Decision], grad: bool = False,
                       trunk_cache: dict | None = None) -> list[torch.Tensor]:
        """log pi(. | decision) over each menu: a (K_i,) float32 tensor whose logsumexp is 0. trunk_cache (the
        caller's dict; LoRA.layers > 0 only): decisions it holds replay their trunk, the others fill it."""
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

    def _score_batch(self, rows: list[tuple[Decision, list[int], list[list[int]]]], trunk: list[torch.Tensor] | None,
                     capture: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One packed forward of distinct decisions, rows = (decision, prompt ids, option targets), trunk: their
        cached trunk outputs. Returns (log pi over each menu, each row's trunk output (T_b, H) if capture else [])."""
        text = self.scoring == "text"
        targets = [row_targets for _, _, row_targets in rows]
        packed = [self._pack_tree(prompt, row_targets if text else []) for _, prompt, row_targets in rows]
        longest = max(max(position) for _, position, _, _ in packed) + 1  # longest prompt + option
        if self.sliding_window and longest > self.sliding_window:
            raise ValueError(f"prompt + option of {longest} tokens exceeds the backbone's sliding attention "
                             f"window ({self.sliding_window}), which the packed mask does not model")
        # logits only where they are read: the last prompt token and every tree token
        keep = max(len(ids) - len(prompt) + 1 for (ids, _, _, _), (_, prompt, _) in zip(packed, rows)) if text else 1
        adapters = [BASE if d.adapter is None else d.adapter for d, _, _ in rows]
        hidden, outputs = self._forward(packed, [len(prompt) for _, prompt, _ in rows], adapters, keep, trunk, capture)
        if not text:
            return self._label_log_probs(hidden, targets), outputs
        return self._text_log_probs(hidden, packed, targets), outputs

    @staticmethod
    def _pack_tree(prompt: list[int], options: list[list[int]]) -> tuple[list, list, list, list]:
        """One packed row: the prompt, then the options as a token tree. Returns per packed token (ids, position
        ids, parent: the index it continues) and per option its path (the packed index of each of its tokens)."""
        ids, position, parent, paths = list(prompt), list(range(len(prompt))), list(range(-1, len(prompt) - 1)), []
        child: dict[tuple[int, int], int] = {}  # (parent index, token) -> packed index of that tree node
        for option in options:
            at, path = len(prompt) - 1, []
            for depth, token in enumerate(option):
                if (at, token) not in child:
                    child[at, token] = len(ids)
                    ids.append(token)
                    position.append(len(prompt) + depth)  # positions restart after the prompt
                    parent.append(at)
                at = child[at, token]
                path.append(at)
            paths.append(path)
        return ids, position, parent, paths

    @staticmethod
    def _tree_mask(packed: list[tuple], prompt_lengths: list[int], width: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask (B, T, T) of left-padded rows: a prompt token sees the prompt up to itself, a tree token
        the prompt and its ancestors, padding itself only (keeps softmax finite; never read)."""
        allowed = torch.eye(width, dtype=torch.bool).repeat(len(packed), 1, 1)  # (B, T, T)
        for b, ((ids, _, parent, _), prompt_length) in enumerate(zip(packed, prompt_lengths)):
            n, pad = len(ids), width - len(ids)
            sees = np.zeros((n, n), dtype=bool)
            sees[:prompt_length, :prompt_length] = np.tril(np.ones((prompt_length, prompt_length), dtype=bool))
            for i in range(prompt_length, n):
                sees[i] = sees[parent[i]]
                sees[i, i] = True
            allowed[b, pad:, pad:] = torch.from_numpy(sees)
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)

    def _forward(self, packed: list[tuple], prompt_lengths: list[int], adapters: list[str], keep: int,
                 trunk: list[torch.Tensor] | None, capture: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The packed rows, left-padded, through the decoder layers, the trunk replayed (trunk given) or captured.
        Returns (final hidden states (B, keep, H), each row's unpadded trunk output (T_b, H) if capture else [])."""
        device = self.device
        width = max(len(ids) for ids, _, _, _ in packed)  # T
        input_ids = torch.full((len(packed), width), self.pad_id, dtype=torch.long)  # (B, T)
        positions = torch.zeros((len(packed), width), dtype=torch.long)  # (B, T)
        for b, (ids, position, _, _) in enumerate(packed):  # left padding: rows end together
            input_ids[b, width - len(ids):] = torch.tensor(ids)
            positions[b, width - len(ids):] = torch.tensor(position)
        mask = self._tree_mask(packed, prompt_lengths, width, self.peft.get_input_embeddings().weight.dtype)
        replay = None
        if trunk is not None:  # cached trunk outputs, left-padded like the ids: (B, T, H)
            replay = torch.zeros((len(packed), width, trunk[0].shape[-1]), dtype=trunk[0].dtype, device=device)
            for b, hidden in enumerate(trunk):
                replay[b, width - len(hidden):] = hidden
        else:
            self.tokens_processed += sum(len(ids) for ids, _, _, _ in packed)
        with self._trunk(replay, capture) as captured:
            hidden = self.forward_layers(input_ids.to(device), mask[:, None].to(device), positions.to(device),
                                         keep, adapters)  # (B, keep, H); mask (B, 1, T, T)
        outputs = [captured[0][b, width - len(ids):].clone() for b, (ids, _, _, _) in enumerate(packed)] if capture \
            else []
        return hidden, outputs

    def forward_layers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       keep: int, adapter_names: list[str]) -> torch.Tensor:
        """The model's forward without its vocabulary head (`head_logits` runs it where a prediction is read):
        the normed final hidden states of the last `keep` columns (B, keep, H). bench.py's "layers"."""
        base = self.peft.get_base_model()
        head, cap = base.lm_head, getattr(base.config, "final_logit_softcapping", None)
        base.lm_head = torch.nn.Identity()  # and final-logit soft-capping off: the "logits" are hidden states
        if cap is not None:
            base.config.final_logit_softcapping = None
        try:
            return self.peft(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             logits_to_keep=keep, use_cache=False, adapter_names=adapter_names).logits
        finally:
            base.lm_head = head
            if cap is not None:
                base.config.final_logit_softcapping = cap

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary head, then final-logit soft-capping if any: (..., H) -> (..., V). bench.py's "head"."""
        base = self.peft.get_base_model()
        logits = base.lm_head(hidden)
        cap = getattr(base.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    @contextlib.contextmanager
    def _trunk(self, replay: torch.Tensor | None, capture: bool):
        """Replay `replay` as the bottom layers' output (they compute nothing), or capture it into the yielded list."""
        captured: list[torch.Tensor] = []

        def keep_input(module, args, kwargs):
            captured.append((args[0] if args else kwargs["hidden_states"]).detach())
        bottom = list(self.layers[: self.trunk]) if replay is not None else []
        for i in range(len(bottom)):
            self.layers[i] = _Replay(replay)
        handle = self.layers[self.trunk].register_forward_pre_hook(keep_input, with_kwargs=True) if capture else None
        try:
            yield captured
        finally:
            for i, layer in enumerate(bottom):
                self.layers[i] = layer
            if handle is not None:
                handle.remove()

    def _label_log_probs(self, hidden: torch.Tensor, labels: list[list[list[int]]]) -> list[torch.Tensor]:
        """log pi over each menu from its labels' next-token logits; hidden (B, 1, H), labels[b][k] = [label id]."""
        logits = self.head_logits(hidden[:, -1])  # (B, V)
        label_ids = [torch.tensor([o[0] for o in options], device=self.device) for options in labels]
        return [torch.log_softmax(logits[b, ids].float(), dim=-1) for b, ids in enumerate(label_ids)]

    def _text_log_probs(self, hidden: torch.Tensor, packed: list[tuple],
                        options: list[list[list[int]]]) -> list[torch.Tensor]:
        """log pi per menu from its options' mean token log-likelihood; hidden (B, keep, H), options[b]: row b's."""
        device = self.device
        width = max(len(ids) for ids, _, _, _ in packed)  # T
        # option token t is predicted by its tree parent's hidden state (t = 0: the last prompt token), read once
        where, position_of, target_of, option_of = [], [], [], []  # where: (row, column) read; rest per token
        option_id = 0  # global index of an option across the batch
        first = width - hidden.shape[1]  # absolute position of kept column 0
        for b, ((ids, _, parent, paths), row_options) in enumerate(zip(packed, options)):
            pad, slot = width - len(ids), {}  # slot: packed index of a parent -> its index in `where`
            for path, option in zip(paths, row_options):
                for node, token in zip(path, option):
                    if parent[node] not in slot:
                        slot[parent[node]] = len(where)
                        where.append((b, pad + parent[node] - first))
                    position_of.append(slot[parent[node]])
                    target_of.append(token)
                    option_of.append(option_id)
                option_id += 1
        menu_sizes = [len(row_options) for row_options in options]
        tensor = functools.partial(torch.tensor, device=device)
        read = tensor(where)  # (U, 2)
        logits = self.head_logits(hidden[read[:, 0], read[:, 1]])  # (U, V)
        # log p(token) = logit(token) - logsumexp(logits), in float32
        log_normalizer = torch.logsumexp(logits.float(), dim=-1)  # (U,)
        slots = tensor(position_of)  # (N,) one per option token
        token_logp = logits[slots, tensor(target_of)].float() - log_normalizer[slots]  # (N,)
        option_index, n_options = tensor(option_of), sum(menu_sizes)
        total = torch.zeros(n_options, device=device).index_add(0, option_index, token_logp)  # (O,)
        count = torch.zeros(n_options, device=device).index_add(0, option_index, torch.ones_like(token_logp))
        score = total / count  # per-token mean log-likelihood of each option
        return [torch.log_softmax(s, dim=-1) for s in torch.split(score, menu_sizes)]  # over each menu

    # ------------------------------------------------------------------ adapters
    def agent_parameters(self, agent: str) -> list[torch.nn.Parameter]:
        """That agent's LoRA matrices only (what its optimizer updates)."""
        if agent not in self.agents:
            raise ValueError(f"unknown agent {agent!r}; agents: {self.agents}")
        return [p for name, p in self.peft.named_parameters() if "lora_" in name and f".{agent}." in name]

    def save_adapters(self, folder: str) -> None:
        """folder/<agent>/adapter_config.json + adapter_model.safetensors (+ README.md): peft's format."""
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
            # peft saves keys without the adapter name: '...q_proj.lora_A.weight'
            wanted = {re.sub(rf"\.{re.escape(agent)}\.", ".", name): p for name, p in self.peft.named_parameters()
                      if "lora_" in name and f".{agent}." in name}
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


# ----------------------------------------------------------------------------- acting: batched play over the runner
# The lockstep loop of every LLM team: rollouts (pamagrpo.py), evaluations and audits (audit.py, no algorithm).
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
    """Sample from softmax(logp / T); T == 0 is greedy (lowest index on ties). On CPU in float64 first, so the
    same log-probs give the same choice on any device."""
    logp = logp.detach().to("cpu", torch.float64)  # (K,)
    if temperature <= 0:
        return int(torch.argmax(logp))
    probs = torch.softmax(logp / temperature, dim=0)
    return int(torch.multinomial(probs, 1, generator=generator))


def play(task: options_lib.Task, seeds: list[int], policy: MenuPolicy, agents: list[str | None],
         temperature: float | list[float], generators: list[torch.Generator], trunk_cache: dict | None = None):
    """One episode from each start state in `seeds`, in lockstep, every pending decision in one scoring call.
    agents[i]: agent i's adapter name, None for the frozen base, or a scripted `choose(runner, agent, menu)` (not
    recorded as a step). temperature: one, or one per rollout (0: greedy). Returns (runners, steps)."""
    temperatures = temperature if isinstance(temperature, list) else [temperature] * len(seeds)
    runners = []
    for seed in seeds:
        game = task.new_game()
        game.reset(seed)
        runners.append(options_lib.Runner(game, task.library, task.menu_filter))
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


def eval_play(policy: MenuPolicy, task: options_lib.Task, seeds: list[int], agents: list, seed: int,
              temperature: float = 0.0) -> tuple[list[options_lib.Runner], list[Step]]:
    """`play` as every evaluation plays: one episode from each start state in `seeds`, each sampled with a generator
    seeded by (seed, EVAL_ITERATION, start state, 0), so an audit replays the very episodes of a run's test."""
    gens = [sampling_generator(seed, EVAL_ITERATION, s, 0) for s in seeds]
    return play(task, list(seeds), policy, list(agents), temperature, gens)


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
