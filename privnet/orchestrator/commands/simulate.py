"""In-process experiments: `privnet simulate`, `reproduce` (the paper's preset) and
`dp-audit` (empirical epsilon lower bounds)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from privnet.agent.spec import Strategy
from privnet.orchestrator import api
from privnet.orchestrator.commands.experiment import experiment, out_dir, trackers
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.terminal import console, table_console


def simulate(args: argparse.Namespace, config: ExperimentConfig) -> int:
    """`privnet.simulate` on the experiment the flags make; exit 1 when a curve diverged."""
    exp = replace(simulation(args, config), out=out_dir(args, config, "simulate"))
    result = api.simulate(exp)
    return 1 if any(record["diverged"] for record in result.records) else 0


def simulation(args: argparse.Namespace, config: ExperimentConfig) -> api.Experiment:
    """`privnet simulate`'s flags as the library's Experiment, checked as the library
    checks one."""
    return api.Experiment.of(
        config,
        engine=args.engine,
        membership=args.membership,
        account=args.account,
        neighbour=args.neighbour,
        tensorboard=args.tensorboard,
        mlflow=args.mlflow,
        mlflow_uri=args.mlflow_uri,
    )


def simulate_config(args: argparse.Namespace) -> ExperimentConfig:
    config = experiment(args)
    simulation(args, config).trackers(None).check()
    return config


def reproduce_config(args: argparse.Namespace) -> ExperimentConfig:
    """The paper's preset on the vectorized oracle: 20 repeats, 3 strategies, 5 schemes."""
    trackers(args, None).check()
    return experiment(args, configuration.load("paper-regression"))


def dp_audit(args: argparse.Namespace, config: ExperimentConfig) -> int:
    """Empirical lower bounds on epsilon for each scheme, against the accountant's claim."""
    from privnet.orchestrator.privacy import dpaudit, sampler

    problem = Instance.build(config)
    out = out_dir(args, config, "dp-audit")
    records = []
    for strategy in config.strategies:
        for scheme in config.schemes:
            with console.status(f"dp-audit {strategy}/{scheme}: {args.trials} trials on D and D'"):
                records += dpaudit.dp_audit(
                    problem, strategy, scheme, args.neighbour, args.trials, config.seed
                )
    samplers = sampler.sampler_report(config.sigma_g)
    report = {
        "config": config.to_dict(),
        "confidence": dpaudit.CONFIDENCE,
        "audits": records,
        "sampler_leak": samplers,
    }
    (out / "dp_audit.json").write_text(json.dumps(report, indent=2) + "\n")
    table_console().print(dpaudit.audit_table(records))
    table_console().print(dpaudit.sampler_table(samplers))
    console.print(f"wrote {out}/dp_audit.json")
    return 0 if all(r["consistent"] for r in records) else 1


def dp_audit_config(args: argparse.Namespace) -> ExperimentConfig:
    base = ExperimentConfig(
        name="dp-audit", agents=10, iters=1, sigma_g2=0.01, strategies=(Strategy.ATC,), repeats=1
    )
    return experiment(args, base)
