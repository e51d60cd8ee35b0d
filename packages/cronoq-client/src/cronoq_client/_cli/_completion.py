"""``cronoq completion bash|zsh|fish``: the shell's completion script, made by click (which
completes commands, options and choices)."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

__all__ = ["completion"]

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script of SHELL.

    \b
    bash:  eval "$(cronoq completion bash)"   (in ~/.bashrc)
    zsh:   eval "$(cronoq completion zsh)"    (in ~/.zshrc)
    fish:  cronoq completion fish > ~/.config/fish/completions/cronoq.fish
    """
    found = get_completion_class(shell)
    assert found is not None  # click knows the three SHELLS
    root = ctx.find_root().command
    click.echo(found(root, {}, "cronoq", "_CRONOQ_COMPLETE").source())
