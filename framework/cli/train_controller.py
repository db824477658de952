"""``adec train-controller``: learn commit policies by imitation, DAgger or RL fine-tuning."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = """\
Decode the task's train split one token per step and record, at every step, the features of every
eligible position (confidence, margin, entropy, position, progress, ...) with the oracle label
"its current prediction already equals the token one-token-per-step decoding ends with", then train
the --policy kinds on them (imitation):

  mlp          a small MLP of one position's features (Lightning; controller 'learned')
  logreg       scikit-learn logistic regression (controller 'logreg')
  transformer  a 1-2 layer transformer over the step's window of eligible positions, so a decision
               can depend on the other positions (Lightning; controller 'learned_window')

--method dagger then runs --rounds rounds: decode with the current policy, label the states it
visits with the reference decode continued from each state, aggregate and retrain.
--method rl fine-tunes the imitation policy with REINFORCE and a group baseline: Bernoulli commit
actions centred on the threshold rule (probability sigmoid((logit p - logit tau)/T)), reward correct -
lambda*NFE/G (or correct*exp(-lambda*NFE/G)), --rl-group rollouts per
prompt; checkpointed every iteration and resumed from rl/checkpoints/last.ckpt when re-run.

Each policy's threshold is calibrated on the validation split (fewest NFE within --max-drop of
sequential accuracy); test-split accuracy and tokens per forward are printed. Logs: CSV and W&B
(offline by default) under OUT/lightning.

Examples:
  adec train-controller --task sudoku9 --policy mlp,transformer --method dagger --rounds 2
  adec train-controller --task phrases --policy mlp --method rl --rl-iterations 20
  adec train-controller --task data --model /models/LLaDA-8B-Instruct --dtype bfloat16 \
      --task-param train=gsm8k_train.jsonl --task-param test=gsm8k_test.jsonl \
      --task-param prompt=question --task-param metric=gsm8k --policy mlp,logreg \
      --n-train 64 --n-val 32 --n-test 64 --decode-batch-size 8 --set cache=dual
  adec decode --controller learned --set policy=runs/controllers/addition-tiny-addition/mlp.pt ...
"""


def register(sub: argparse._SubParsersAction) -> None:
    from adaptive_decoding.framework.cli.options import MODEL_HELP, TASK_PARAM_HELP, add_model_args

    p = sub.add_parser("train-controller", help="train a learned commit policy (mlp, logreg, window "
                                                "transformer) by imitation, DAgger or RL",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help="task name (see 'adec list tasks')")
    add_model_args(p, model_default=None, model_help=MODEL_HELP)
    p.add_argument("--task-param", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help=TASK_PARAM_HELP)
    p.add_argument("--out", default=None,
                   help="output folder (default: runs/controllers/TASK-MODEL, with -dagger or -rl appended)")
    _add_method_options(p)
    _add_rl_options(p)
    _add_training_options(p)
    p.set_defaults(func=run)


def _add_method_options(p: argparse.ArgumentParser) -> None:
    """How the policy is learned: method, policy kinds, their shape, the DAgger rounds."""
    p.add_argument("--method", default="imitation", choices=("imitation", "dagger", "rl"),
                   help="imitation (default), dagger (on-policy rounds) or rl (REINFORCE fine-tune)")
    p.add_argument("--policy", default="mlp,logreg",
                   help="policy kinds to train, comma separated: mlp, logreg, transformer (default: "
                        "mlp,logreg)")
    p.add_argument("--residual", action="store_true",
                   help="mlp/transformer learn a correction of the confidence rule: logit p(safe) = "
                        "logit(confidence) + g(features), g zero at the start (Fast-dLLM's threshold rule)")
    p.add_argument("--neg-weight", type=float, default=1.0,
                   help="weight of unsafe rows in the loss: a wrong commit can cost the answer (default: 1)")
    p.add_argument("--labels", default="reference", choices=("reference", "set"),
                   help="reference: a position is safe when its prediction equals the token the reference "
                        "decode ends with; set: safe together with the more confident positions of its step "
                        "(greedy along the confidence ranking, checked by the task's verifier of partial "
                        "answers; every visited state is labelled, no reference decodes) (default: reference)")
    p.add_argument("--rounds", type=int, default=2, help="DAgger rounds (default: 2)")
    p.add_argument("--states-per-rollout", type=int, default=4,
                   help="DAgger: visited steps labelled per prompt, each costs one reference decode "
                        "(default: 4)")
    p.add_argument("--dagger-threshold", type=float, default=0.9,
                   help="threshold the policy decodes with while DAgger visits states (default: 0.9)")
    p.add_argument("--window-arch", default="32,2,4", metavar="D,LAYERS,HEADS",
                   help="transformer width, layers and heads (default: 32,2,4)")


def _add_rl_options(p: argparse.ArgumentParser) -> None:
    """The RL fine-tune's options (``--rl-*``, ``--no-resume``)."""
    p.add_argument("--rl-iterations", type=int, default=20,
                   help="RL: policy-gradient iterations (default: 20)")
    p.add_argument("--rl-prompts", type=int, default=16, help="RL: prompts per iteration (default: 16)")
    p.add_argument("--rl-group", type=int, default=4,
                   help="RL: rollouts per prompt, the group baseline (default: 4)")
    p.add_argument("--rl-lambda", type=float, default=0.5,
                   help="RL: λ, the weight of NFE/G in the reward (default: 0.5)")
    p.add_argument("--rl-reward", default="additive", choices=("additive", "multiplicative"),
                   help="RL: correct − λ·NFE/G (additive, default) or correct·exp(−λ·NFE/G)")
    p.add_argument("--rl-lr", type=float, default=1e-3, help="RL: Adam learning rate (default: 1e-3)")
    p.add_argument("--rl-threshold", type=float, default=0.99,
                   help="RL: τ of the sampled policy, which commits with probability σ((logit p − logit "
                        "τ)/T) (default: 0.99)")
    p.add_argument("--rl-temperature", type=float, default=1.0,
                   help="RL: T of the sampled policy (default: 1)")
    p.add_argument("--rl-no-std", action="store_true",
                   help="RL: advantage R − group mean, not divided by the group's std (GRPO's division gives "
                        "tiny NFE differences among all-correct rollouts the weight of a right/wrong "
                        "difference)")
    p.add_argument("--rl-verify", type=float, default=None, metavar="TAU2",
                   help="RL: roll the sampled policy out inside 'verified' (WINO's hidden-slot check at τ₂ = "
                        "TAU2), so commits that fail it return to the mask; calibration and the test decode "
                        "then use 'verified' too, and so should you (default: off)")
    p.add_argument("--no-resume", action="store_true", help="RL: start afresh even if a checkpoint exists")


def _add_training_options(p: argparse.ArgumentParser) -> None:
    """Data sizes, the optimiser, calibration, logging and the decoding options."""
    p.add_argument("--n-train", type=int, default=256, help="train-split prompts to roll out (default: 256)")
    p.add_argument("--n-val", type=int, default=64, help="validation prompts (default: 64)")
    p.add_argument("--n-test", type=int, default=200, help="test prompts for the report (default: 200)")
    p.add_argument("--hidden", default="32,32", help="MLP hidden sizes, comma separated (default: 32,32)")
    p.add_argument("--max-epochs", type=int, default=40, help="default: 40")
    p.add_argument("--patience", type=int, default=5, help="early-stopping patience in epochs (default: 5)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default: 3e-3)")
    p.add_argument("--batch-size", type=int, default=256, help="training batch size in rows (default: 256)")
    p.add_argument("--features", default=None, metavar="NAMES",
                   help="the feature columns the policies read, comma separated: names or the groups self "
                        "(13 per-position columns), dependence (8: neighbours, nearest uncertain position), "
                        "peer (4: the task's declared structure, e.g. a Sudoku cell's row, column and box); "
                        "'confidence' is required (default: every group that is not constant on the task, "
                        "i.e. peer only where the task declares a structure; the columns are listed in "
                        "docs/learned.md)")
    p.add_argument("--rollout", default=None,
                   help="record the states of this controller instead of sequential (labels stay "
                        "sequential's)")
    p.add_argument("--no-calibrate", action="store_true", help="keep threshold 0.9 instead of calibrating")
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="calibration: accuracy allowed below sequential (default: 0.01)")
    p.add_argument("--wandb", default="offline", choices=("offline", "online", "disabled"),
                   help="Weights & Biases mode (default: offline)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding option (gen_length, block_length, temperature, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decode-batch-size", type=int, default=64,
                   help="prompts decoded together in the rollouts, calibration and test decodes (default: 64; "
                        "lower it for a large model)")
    p.add_argument("--accelerator", default="cpu", help="Lightning accelerator for the MLP (default: cpu)")


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.cli.options import model_options, parse_task_params
    from adaptive_decoding.framework.learning.pipeline import check_options, train_policy

    try:
        hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    except ValueError:
        raise CLIError(f"--hidden={args.hidden!r}: expected comma-separated integers, e.g. 32,32") from None
    try:
        d, layers, heads = (int(v) for v in args.window_arch.split(","))
    except ValueError:
        raise CLIError(f"--window-arch={args.window_arch!r}: expected D,LAYERS,HEADS, e.g. 32,2,4") from None
    if min(d, layers, heads) < 1 or d % heads:
        raise CLIError(f"--window-arch={args.window_arch!r}: all ≥ 1 and D a multiple of HEADS")
    if any(h < 1 for h in hidden) or min(args.n_train, args.n_val, args.max_epochs, args.decode_batch_size) < 1:
        raise CLIError("--hidden sizes, --n-train, --n-val, --max-epochs and --decode-batch-size must be ≥ 1")
    policies = tuple(p.strip() for p in args.policy.split(",") if p.strip())
    try:
        check_options(args.method, policies, args.rounds, args.states_per_rollout, labels=args.labels,
                      features=args.features)
    except ValueError as exc:
        flag = {"method": "--method", "policy": "--policy", "rounds": "--rounds", "features": "--features",
                "states_per_rollout": "--states-per-rollout"}.get(str(exc).split("=")[0], "")
        raise CLIError(f"{flag}: {exc}" if flag else str(exc)) from None
    if args.method == "rl" and (min(args.rl_iterations, args.rl_prompts) < 1 or args.rl_group < 2
                                or not args.rl_lambda >= 0):
        raise CLIError(f"--rl-iterations={args.rl_iterations} and --rl-prompts={args.rl_prompts} must be ≥ "
                       f"1, --rl-group={args.rl_group} ≥ 2 (the group baseline), "
                       f"--rl-lambda={args.rl_lambda} ≥ 0")
    if args.method == "rl" and not (0.0 < args.rl_threshold < 1.0 and args.rl_temperature > 0):
        raise CLIError(f"--rl-threshold={args.rl_threshold} must be strictly between 0 and 1 and "
                       f"--rl-temperature={args.rl_temperature} > 0")
    if args.rl_verify is not None and not 0.0 <= args.rl_verify <= 1.0:
        raise CLIError(f"--rl-verify={args.rl_verify}; allowed: 0 to 1 (τ₂ of WINO's hidden-slot check)")
    if args.rl_verify is not None and args.method != "rl":
        raise CLIError(f"--rl-verify={args.rl_verify} has no effect with --method {args.method}; it needs "
                       f"--method rl")
    if not args.neg_weight > 0:
        raise CLIError(f"--neg-weight={args.neg_weight}; allowed: a number > 0")
    if not 0.0 <= args.dagger_threshold <= 1.0:
        raise CLIError(f"--dagger-threshold={args.dagger_threshold}; allowed: 0 to 1")
    options = model_options(args)
    train_policy(args.task, policy_options(args, policies, hidden, {"d_model": d, "layers": layers, "heads": heads}),
                 model=args.model, task_params=parse_task_params(args.task, args.task_params),
                 model_options=options, device=options.pop("device"))
    return 0


def policy_options(args: argparse.Namespace, policies: tuple, hidden: tuple, window_arch: dict) -> Any:
    """The pipeline's :class:`~adaptive_decoding.framework.learning.options.PolicyOptions`, built once from the flags
    (``policies``, ``hidden`` and ``window_arch`` already parsed from their text)."""
    from adaptive_decoding.framework.core.params import parse_assignments
    from adaptive_decoding.framework.learning.options import PolicyOptions

    return PolicyOptions.from_dict({
        "data": {"n_train": args.n_train, "n_val": args.n_val, "n_test": args.n_test, "rollout": args.rollout,
                 "labels": args.labels, "features": args.features, "decode": parse_assignments(args.sets),
                 "decode_batch_size": args.decode_batch_size},
        "network": {"policies": list(policies), "hidden": list(hidden), "window_arch": window_arch,
                    "residual": args.residual},
        "training": {"lr": args.lr, "max_epochs": args.max_epochs, "patience": args.patience,
                     "batch_size": args.batch_size, "seed": args.seed, "accelerator": args.accelerator,
                     "neg_weight": args.neg_weight},
        "rounds": {"method": args.method, "rounds": args.rounds, "states_per_rollout": args.states_per_rollout,
                   "dagger_threshold": args.dagger_threshold},
        "rl": {"iterations": args.rl_iterations, "prompts": args.rl_prompts, "group": args.rl_group,
               "lam": args.rl_lambda, "reward_form": args.rl_reward, "lr": args.rl_lr, "resume": not args.no_resume,
               "threshold": args.rl_threshold, "temperature": args.rl_temperature, "normalise": not args.rl_no_std,
               "verify_threshold": args.rl_verify},
        "calibration": {"calibrate": not args.no_calibrate, "max_drop": args.max_drop},
        "output": {"out_dir": args.out, "wandb_mode": args.wandb},
    })
