"""``mmpos list``: the registered encodings, their kind and one-line description (``-v``: their options)."""

from __future__ import annotations


def register(subparsers) -> None:
    lister = subparsers.add_parser("list", help="list registered encodings", description="List registered encodings.")
    lister.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list each encoding's options (default: names and one-line descriptions only)",
    )
    lister.set_defaults(func=run)


def run(args) -> int:
    import inspect

    from mmpos.encodings import list_pes, pe_class, pe_description, pe_options  # the registry (imports torch)

    width = max(map(len, list_pes()))
    for name in list_pes():
        print(f"{name:{width}s}  [{pe_class(name).kind}] {pe_description(name)}")
        if args.verbose:
            for option, default in pe_options(name).items():
                shown = "(required)" if default is inspect.Parameter.empty else f"= {default!r}"
                print(f"    {option} {shown}")
    return 0
