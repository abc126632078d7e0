"""Parse `.wpk` DSL source into compute IR operators (see dsl/LANGUAGE.md).

`parse_source(text, filename)` and `parse_file(path)` return the operators a
file defines, in order. Syntax errors (from lark) and semantic errors (from
`OperatorBuilder` and `typecheck.ExprChecker`) raise `DslError` whose message
starts with `file:line:col:` and whose hint says what to do.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from wpk.core.errors import DslError
from wpk.dsl import compute as ir
from wpk.dsl import toolchain
from wpk.dsl.typecheck import Context, ExprChecker, Scope, TensorInfo, dtype_name, position

GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")


def _parser_cache() -> str | bool:
    """Where lark keeps the grammar's parse tables between processes (under the compile
    cache's root: lark's default is a file in the shared temp folder, and it unpickles
    what it finds); False where that folder cannot be made. Lark checks the file against a
    hash of the grammar, its options and lark's version, rebuilds a stale or damaged one,
    and carries on when it cannot write."""
    folder = toolchain.cache_root() / "lark"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return str(folder / "dsl-grammar.cache")


@functools.cache
def _lark() -> Lark:
    """The DSL's LALR parser (its tables built in 70 ms, read from the cache in 7)."""
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="basic", propagate_positions=True,
                maybe_placeholders=True, cache=_parser_cache())


def parse_file(path: str | Path) -> list[ir.Operator]:
    """The operators defined in a `.wpk` file."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a device or a pipe would be read forever
        raise DslError(f"{path}: not a regular file", hint="give the path of a .wpk DSL file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DslError(f"{path}: cannot read DSL file ({exc.strerror})",
                       hint="check the path") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise DslError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x})",
                       hint="save the DSL file as UTF-8") from None
    return parse_source(text, str(path))


def parse_source(text: str, filename: str = "<string>") -> list[ir.Operator]:
    """The operators defined in DSL source `text` (`filename` is used in messages)."""
    return list(_parsed(text, filename))


@functools.lru_cache(maxsize=512)
def _parsed(text: str, filename: str) -> tuple[ir.Operator, ...]:
    """`parse_source`, kept per text: the operators are frozen, and the kernel mappers
    parse the same few templates for every workload (DenseNet-121's build parsed six
    texts 129 times, about 5 ms each with lark)."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, filename) from None
    operators = []
    names: dict[str, tuple[int, int]] = {}
    for op_tree in tree.children:
        name_token = op_tree.children[0]
        if str(name_token) in names:
            line, col = names[str(name_token)]
            raise DslError(f"{filename}:{name_token.line}:{name_token.column}: operator "
                           f"'{name_token}' is already defined at {line}:{col}",
                           hint="rename one of the operators")
        names[str(name_token)] = position(name_token)
        op = OperatorBuilder(filename).build(op_tree)
        operators.append(replace(op, doc=_leading_comment(text, name_token.line)))
    return tuple(operators)


def _leading_comment(text: str, line: int) -> str:
    """The `#` comment lines directly above line `line` (an operator's documentation)."""
    lines = text.splitlines()
    doc: list[str] = []
    k = line - 2
    while k >= 0 and lines[k].strip().startswith("#"):
        doc.insert(0, lines[k].strip().lstrip("#").strip())
        k -= 1
    return "\n".join(doc)


def _describe_terminal(name: str) -> str:
    readable = {"NAME": "a name", "INT": "an integer", "FLOAT": "a number", "TYPE": "a type",
                "STRING": "a string", "$END": "end of file", "COMPARE": "a comparison",
                "MUL_OP": "'*'", "PLUS": "'+'", "MINUS": "'-'"}
    if name in readable:
        return readable[name]
    try:
        pattern = _lark().get_terminal(name).pattern
    except KeyError:
        return name
    return f"'{pattern.value}'" if pattern.type == "str" else name


def _syntax_error(exc: UnexpectedInput, text: str, filename: str) -> DslError:
    line, column = exc.line if exc.line > 0 else 1, exc.column if exc.column > 0 else 1
    expected = sorted({_describe_terminal(t) for t in (getattr(exc, "expected", None)
                                                        or getattr(exc, "allowed", None) or ())})
    expect_text = f"expected {', '.join(expected)}" if expected else "check the syntax"
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else "?"
        message = f"syntax error: unexpected character {char!r}"
    elif isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken)
                                            and exc.token.type == "$END"):
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
        message = "syntax error: unexpected end of file"
        expect_text += " (is a closing '}' or ')' missing?)"
    else:
        token = exc.token
        message = f"syntax error: unexpected {str(token)!r}"
    source_line = text.splitlines()[line - 1] if 0 < line <= len(text.splitlines()) else ""
    hint = expect_text + (f"\n  {source_line.strip()}" if source_line.strip() else "")
    return DslError(f"{filename}:{line}:{column}: {message}", hint=hint)


class OperatorBuilder:
    """Checks one `op` definition and builds its `compute.Operator`."""

    def __init__(self, filename: str):
        self.filename = filename
        self.scope = Scope()
        self.checker = ExprChecker(filename, self.scope)
        self.declared_at: dict[str, tuple[int, int]] = {}

    def error(self, node, message: str, hint: str) -> DslError:
        return self.checker.error(node, message, hint)

    def declare(self, token: Token) -> str:
        name = str(token)
        if name in self.declared_at:
            line, col = self.declared_at[name]
            raise self.error(token, f"'{name}' is already defined at {line}:{col}",
                             "every input, scalar, dim, let, output and local needs its own "
                             "name")
        self.declared_at[name] = position(token)
        return name

    def build(self, tree: Tree) -> ir.Operator:
        name_token, *rest = tree.children
        outputs_tree = next(c for c in rest if isinstance(c, Tree) and c.data == "outputs")
        args = [c for c in rest[:rest.index(outputs_tree)] if c is not None]
        statements = rest[rest.index(outputs_tree) + 1:]

        scalars = [self.scalar(a) for a in args if a.data == "scalar_arg"]
        tensor_args = [a for a in args if a.data == "tensor_arg"]
        for a in tensor_args:
            self.declare(a.children[0])
        let_names = {str(st.children[0]) for st in statements if st.data == "let_stmt"}
        self.bind_shape_symbols(tensor_args, {s.name for s in scalars} | let_names)

        derived, requires = [], []
        for st in statements:
            if st.data == "let_stmt":
                name = self.declare(st.children[0])
                expr = self.checker.dim(st.children[1])
                derived.append((name, expr))
                self.scope.symbols[name] = ir.SymVar(name, ir.INDEX)
            elif st.data == "require_stmt":
                cond = self.checker.condition(st.children[0], Context(dims_only=True,
                                                                      reduce_allowed=False))
                message = (str(st.children[1])[1:-1] if st.children[1] is not None
                           else f"requirement {ir.to_text(cond)} failed")
                requires.append(ir.Require(cond, message))

        params = []
        for a in tensor_args:
            dtype, shape = self.tensor_type(a.children[1])
            params.append(ir.Param(str(a.children[0]), dtype, shape))
            self.scope.tensors[str(a.children[0])] = TensorInfo(str(a.children[0]), dtype,
                                                                shape, "input")
        output_decls = outputs_tree.children
        for decl in output_decls:
            self.declare_tensor(decl.children[0], decl.children[1], "output")
        for st in statements:
            if st.data == "local_stmt":
                self.declare_tensor(st.children[0], st.children[1], "local")

        stages = [self.stage(st) for st in statements if st.data == "stage_stmt"]
        for info_token in [d.children[0] for d in output_decls] + \
                [st.children[0] for st in statements if st.data == "local_stmt"]:
            info = self.scope.tensors[str(info_token)]
            if not info.defined:
                raise self.error(info_token, f"{info.kind} '{info.name}' is declared but never "
                                             f"defined",
                                 f"add a statement {info.name}[...] = ... to the operator body")
        line, col = position(name_token)
        return ir.Operator(
            name=str(name_token), params=tuple(params), scalars=tuple(scalars),
            stages=tuple(stages), outputs=tuple(str(d.children[0]) for d in output_decls),
            derived=tuple(derived), requires=tuple(requires),
            source=ir.SourceSpan(self.filename, line, col))

    def scalar(self, tree: Tree) -> ir.Scalar:
        name_token, type_token, default_tree = tree.children
        name = self.declare(name_token)
        dtype = dtype_name(type_token)
        if dtype == "bool":
            raise self.error(type_token, "bool scalars are not supported",
                             "use an int scalar with 0 or 1")
        default = None
        if default_tree is not None:
            value = self.checker.build(default_tree, Context())
            value = self.checker.coerce(value, dtype, default_tree, f"default of '{name}'")
            default = value.value  # type: ignore[attr-defined]
        self.scope.symbols[name] = ir.SymVar(name, dtype)
        return ir.Scalar(name, dtype, default)

    def bind_shape_symbols(self, tensor_args: list[Tree], not_symbols: set[str]) -> None:
        """Plain-name dims of inputs (not scalars or lets) become shape symbols."""
        for a in tensor_args:
            for dim in a.children[1].children[1:]:
                if isinstance(dim, Tree) and dim.data == "name":
                    token = dim.children[0]
                    if str(token) in not_symbols or str(token) in self.scope.symbols:
                        continue
                    self.declare(token)
                    self.scope.symbols[str(token)] = ir.SymVar(str(token), ir.INDEX)

    def tensor_type(self, tree: Tree) -> tuple[str, tuple[ir.Expr, ...]]:
        dtype = dtype_name(tree.children[0])
        dims = tuple(self.checker.dim(d) for d in tree.children[1:] if d is not None)
        return dtype, dims

    def declare_tensor(self, name_token: Token, type_tree: Tree, kind: str) -> None:
        name = self.declare(name_token)
        dtype, shape = self.tensor_type(type_tree)
        self.scope.tensors[name] = TensorInfo(name, dtype, shape, kind)

    def stage(self, tree: Tree) -> ir.Stage:
        target, *index_tokens, body_tree = tree.children
        index_tokens = [t for t in index_tokens if t is not None]
        name = str(target)
        info = self.scope.tensors.get(name)
        if info is None:
            raise self.error(target, f"'{name}' is not declared",
                             f"declare it with `local {name}: f32[...]` or as an output "
                             f"after `->`")
        if info.kind == "input":
            raise self.error(target, f"cannot assign to input '{name}'",
                             "inputs are read-only; write to an output or a local")
        if info.defined:
            raise self.error(target, f"'{name}' is defined twice",
                             "each output and local is defined by exactly one statement")
        if len(index_tokens) != len(info.shape):
            raise self.error(target, f"rank mismatch: '{name}' has {len(info.shape)} "
                                     f"dimension(s) but is defined with {len(index_tokens)} "
                                     f"index variable(s)",
                             f"{name} is {info.dtype}[{', '.join(map(ir.to_text, info.shape))}]")
        axes: dict[str, ir.IterVar] = {}
        for token, extent in zip(index_tokens, info.shape):
            index = str(token)
            if index in axes or index in self.scope.symbols or index in self.scope.tensors:
                raise self.error(token, f"index variable '{index}' clashes with an existing name",
                                 "use a fresh lower-case name for each index variable")
            axes[index] = ir.IterVar(index, extent, "spatial")
        ctx = Context(stage=name, spatial=axes)
        body = self.checker.build(body_tree, ctx)
        body = self.checker.coerce(body, info.dtype, body_tree, f"value of '{name}'")
        info.defined = True
        return ir.Stage(name, tuple(axes.values()), body, info.dtype)
