"""``adec train-controller``: learn a commit policy from rollouts of one-token-per-step decoding."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Decode the task's train split one token per step and record, at every step, the features of every
eligible position (confidence, margin, entropy, position, progress, ...) with the oracle label
"its current prediction already equals the token one-token-per-step decoding ends with". Train a
scikit-learn logistic regression (logreg.pt) and a small MLP as a Lightning module (mlp.pt; CSV and
W&B logging, ModelCheckpoint and EarlyStopping on the validation loss), print ROC-AUC and precision
at the operating threshold, calibrate that threshold on the validation split (fewest NFE within
--max-drop of sequential accuracy) and report test-split accuracy and tokens per forward.

Example:
  adec train-controller --task addition
  adec decode --controller learned --set policy=runs/controllers/addition-tiny-addition/mlp.pt ...
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-controller", help="train the learned (MLP) and logreg commit policies",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help="task name (see 'adec list tasks')")
    p.add_argument("--model", default=None, help="model name or folder (default: tiny-<task>)")
    p.add_argument("--task-param", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help="task size knob, repeatable (e.g. --task-param digits=2)")
    p.add_argument("--out", default=None, help="output folder (default: runs/controllers/TASK-MODEL)")
    p.add_argument("--n-train", type=int, default=256, help="train-split prompts to roll out (default: 256)")
    p.add_argument("--n-val", type=int, default=64, help="validation prompts (default: 64)")
    p.add_argument("--n-test", type=int, default=200, help="test prompts for the report (default: 200)")
    p.add_argument("--hidden", default="32,32", help="MLP hidden sizes, comma separated (default: 32,32)")
    p.add_argument("--max-epochs", type=int, default=40, help="default: 40")
    p.add_argument("--patience", type=int, default=5, help="early-stopping patience in epochs (default: 5)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default: 3e-3)")
    p.add_argument("--batch-size", type=int, default=256, help="training batch size in rows (default: 256)")
    p.add_argument("--rollout", default=None,
                   help="record the states of this controller instead of sequential (labels stay sequential's)")
    p.add_argument("--no-calibrate", action="store_true", help="keep threshold 0.9 instead of calibrating")
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="calibration: accuracy allowed below sequential (default: 0.01)")
    p.add_argument("--wandb", default="offline", choices=("offline", "online", "disabled"),
                   help="Weights & Biases mode (default: offline)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding option (gen_length, block_length, temperature, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="device of the denoiser (default: cpu)")
    p.add_argument("--accelerator", default="cpu", help="Lightning accelerator for the MLP (default: cpu)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from framework.cli.errors import CLIError
    from framework.core.params import parse_assignments
    from framework.learning.train import train_policy

    try:
        hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    except ValueError:
        raise CLIError(f"--hidden={args.hidden!r}: expected comma-separated integers, e.g. 32,32") from None
    if any(h < 1 for h in hidden) or min(args.n_train, args.n_val, args.max_epochs) < 1:
        raise CLIError("--hidden sizes, --n-train, --n-val and --max-epochs must be ≥ 1")
    train_policy(
        args.task, model=args.model, task_params=parse_assignments(args.task_params), out_dir=args.out,
        n_train=args.n_train, n_val=args.n_val,
        n_test=args.n_test, hidden=hidden, max_epochs=args.max_epochs, patience=args.patience, lr=args.lr,
        batch_size=args.batch_size, seed=args.seed, wandb_mode=args.wandb, calibrate=not args.no_calibrate,
        max_drop=args.max_drop, rollout=args.rollout, decode_options=parse_assignments(args.sets),
        device=args.device, accelerator=args.accelerator,
    )
    return 0
