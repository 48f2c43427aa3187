"""A bounded pre-scan of a pickle's opcode stream, run before anything unpickles it.

An unpickler restricted to harmless names (``torch.load(weights_only=True)``, tvr's own for MSVD captions and
TorchScript archives) still trusts the *shape* of the stream, and a few bytes can abuse it:

* nesting: ``b'\\x80\\x02})' + b'\\x85' * 10**6 + b']s.'`` builds a tuple a million levels deep and uses it as a dict
  key; hashing it recurses in C without a limit and the process dies of a stack overflow (SIGSEGV);
* the memo: ``b'\\x80\\x02]r\\x00\\x00\\x00\\x08.'`` (9 bytes) stores an object at memo index 2²⁷, and the C unpickler
  sizes its memo table to the index (2 GB);
* lengths: a string or a ``FRAME`` announcing more bytes than the stream holds.

:func:`scan_pickle` walks the opcodes (``pickletools.genops``, which reads every argument from the bytes present and
so never allocates what a length field merely claims) and simulates the unpickler's stack without building any
object: every stack entry carries the height of the object it stands for (a leaf 0, a container one more than its
tallest element). It refuses

* a height above ``max_depth`` (:data:`MAX_NESTING`);
* a memo index larger than the number of opcodes read so far (a pickler numbers its memo entries 0, 1, 2, …, one
  opcode each), or a read of an index never stored;
* a ``FRAME`` longer than the rest of the stream, an argument cut short, an unknown opcode, a stack or mark misuse;
* a container changed after it was placed inside another one. Heights are exact only if a container is complete
  when it is placed, which is how every pickler writes an acyclic object; the one thing a pickler writes otherwise
  is a cycle (a list that contains itself), which no file tvr reads holds, and a crafted stream could use the same
  trick to stack containers into one another out of the scan's sight. The result of a call (``REDUCE``, ``NEWOBJ``)
  may be one of its arguments (TorchScript's list helpers return theirs), so changing it counts as changing them.

The scan costs about as much as reading the pickle with ``pickletools`` (a few microseconds an opcode) and no
memory beyond one small record per container.
"""

from __future__ import annotations

import io
import pickletools
from typing import Any, BinaryIO

from tvr.utils.errors import UserError, first_line

#: the deepest nesting accepted. A tvr checkpoint nests about 10 levels (dict → tensor → rebuild arguments → size
#: tuple), a TorchScript module tree two per submodule level (about 25 for CLIP); C recursion over nested tuples
#: (hashing one) is safe far beyond this, Python's recursion limit (1000) too.
MAX_NESTING = 200


#: how many earlier objects a call's result may be (its arguments, theirs, …): a tensor's rebuild call stands for
#: about 10 (its argument tuple, size, stride, hook dict); a crafted chain of calls on calls for as many as it has
MAX_ALIASES = 256


class PickleRefusedError(UserError, ValueError):
    """A file refused before (or, for what only the result shows, right after) it is unpickled: ``what`` names the
    file (and member), ``reason`` says what breaks which bound."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class _Node:
    """What the scan knows of one object on the simulated stack."""

    __slots__ = ("height", "placed", "aliases", "items")

    def __init__(self, height: int, items: tuple[_Node, ...] = (), aliases: tuple[_Node, ...] = ()) -> None:
        self.height = height
        #: how many containers hold it so far
        self.placed = 0
        #: objects a call's result may be (its arguments): changing the result changes them
        self.aliases = aliases
        #: a tuple's elements (a call's arguments are a tuple)
        self.items = items


#: every leaf (number, string, bytes, None, a class, a persistent object) is the same node: it cannot be changed,
#: and its placements need no count
_LEAF = _Node(0)
_MARK = object()

_LEAVES = frozenset(
    {
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "NEXT_BUFFER",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "FLOAT",
        "BINFLOAT",
        "EXT1",
        "EXT2",
        "EXT4",
        "GLOBAL",
        "PERSID",
    }
)
_EMPTY_CONTAINERS = frozenset({"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"})
#: containers built from the items above the last mark
_FROM_MARK = frozenset({"TUPLE", "LIST", "DICT", "FROZENSET"})
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
#: opcodes that add the items above the last mark to the container below it
_ADD_FROM_MARK = frozenset({"APPENDS", "SETITEMS", "ADDITEMS"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_NO_STACK_EFFECT = frozenset({"PROTO", "READONLY_BUFFER"})
#: every opcode the scan models (a test checks this is all of them)
HANDLED = (
    _LEAVES
    | _EMPTY_CONTAINERS
    | _FROM_MARK
    | frozenset(_TUPLE_N)
    | _ADD_FROM_MARK
    | _PUTS
    | _GETS
    | _NO_STACK_EFFECT
    | frozenset(
        {
            "EMPTY_TUPLE",
            "APPEND",
            "SETITEM",
            "BUILD",
            "REDUCE",
            "NEWOBJ",
            "NEWOBJ_EX",
            "OBJ",
            "INST",
            "STACK_GLOBAL",
            "BINPERSID",
            "POP",
            "POP_MARK",
            "DUP",
            "MARK",
            "MEMOIZE",
            "FRAME",
            "STOP",
        }
    )
)


class _Scan:
    def __init__(self, what: str, max_depth: int, size: int) -> None:
        self.what = what
        self.max_depth = max_depth
        self.size = size
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.pos = 0

    def refuse(self, reason: str) -> PickleRefusedError:
        return PickleRefusedError(self.what, f"{reason} (at byte {self.pos}); refusing to unpickle it")

    def pop(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.refuse("an opcode takes an object from an empty stack")
        return self.stack.pop()

    def pop_to_mark(self) -> list[Any]:
        if not self.marks:
            raise self.refuse("an opcode takes the items above a mark, and there is no mark")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self) -> _Node:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.refuse("an opcode changes the object on top of an empty stack")
        return self.stack[-1]

    def place(self, items: list[_Node] | tuple[_Node, ...]) -> int:
        """Place ``items`` in a container (count it); the container's height."""
        height = 1
        for item in items:
            if item is not _LEAF:
                item.placed += 1
                if item.height >= height:
                    height = item.height + 1
        if height > self.max_depth:
            raise self.refuse(f"objects nested more than {self.max_depth} levels deep")
        return height

    def container(self, items: list[_Node] | tuple[_Node, ...], keep_items: bool = False) -> _Node:
        """A new container of ``items``."""
        return _Node(self.place(items), tuple(items) if keep_items else ())

    def change(self, target: _Node, items: list[_Node]) -> None:
        """``items`` are added to ``target`` (APPEND, SETITEM, BUILD, …)."""
        if target is _LEAF:
            return  # the unpickler refuses to change a leaf; nothing here can nest
        height = self.place(items)
        if target.placed or any(alias.placed > 1 for alias in target.aliases):
            raise self.refuse(
                "a container is changed after it was placed in another one (a cycle, or a stream crafted to "
                "hide how deep its objects nest)"
            )
        if height > target.height:
            target.height = height
        for alias in target.aliases:
            alias.height = max(alias.height, height)

    def call(self, function: _Node, arguments: list[_Node]) -> _Node:
        """The result of calling ``function`` with ``arguments`` (it may be one of them)."""
        aliases: list[_Node] = []
        for argument in arguments:
            for element in (argument, *argument.items):
                if element is not _LEAF:
                    aliases.extend((element, *element.aliases))
        if len(aliases) > MAX_ALIASES:  # a chain of calls, each on the last one's result: bounded, so the scan is
            raise self.refuse(  # linear in the stream, not quadratic
                f"a call's result may stand for more than {MAX_ALIASES} earlier objects (a chain of calls on calls)"
            )
        result = self.container([function, *arguments])
        result.aliases = tuple(dict.fromkeys(aliases))
        return result

    def memo_index(self, index: Any, ops: int) -> int:
        if not isinstance(index, int) or not 0 <= index <= ops:
            raise self.refuse(f"memo index {index} is out of range for a stream of {ops} opcodes so far")
        return index

    def step(self, name: str, arg: Any, ops: int) -> bool:
        """Apply one opcode; True at STOP."""
        stack = self.stack
        if name in _LEAVES:
            stack.append(_LEAF)
        elif name in _PUTS or name == "MEMOIZE":
            index = len(self.memo) if name == "MEMOIZE" else self.memo_index(arg, ops)
            self.memo[index] = self.top()
        elif name in _GETS:
            index = self.memo_index(arg, ops)
            if index not in self.memo:
                raise self.refuse(f"memo index {index} is read before it is stored")
            stack.append(self.memo[index])
        elif name == "APPEND":
            item = self.pop()
            self.change(self.top(), [item])
        elif name == "SETITEM":
            value, key = self.pop(), self.pop()
            self.change(self.top(), [key, value])
        elif name in _ADD_FROM_MARK:
            items = self.pop_to_mark()
            self.change(self.top(), items)
        elif name == "BUILD":
            state = self.pop()
            self.change(self.top(), [state])
        elif name in _EMPTY_CONTAINERS:
            stack.append(_Node(1))
        elif name == "EMPTY_TUPLE":
            stack.append(_Node(1))
        elif name in _TUPLE_N:
            items = [self.pop() for _ in range(_TUPLE_N[name])][::-1]
            stack.append(self.container(items, keep_items=True))
        elif name in _FROM_MARK:
            stack.append(self.container(self.pop_to_mark(), keep_items=name == "TUPLE"))
        elif name == "MARK":
            self.marks.append(len(stack))
        elif name == "REDUCE" or name == "NEWOBJ":
            arguments = self.pop()
            stack.append(self.call(self.pop(), [arguments]))
        elif name == "NEWOBJ_EX":
            keywords, arguments = self.pop(), self.pop()
            stack.append(self.call(self.pop(), [arguments, keywords]))
        elif name == "OBJ":
            items = self.pop_to_mark()
            if not items:
                raise self.refuse("OBJ without a class")
            stack.append(self.call(items[0], items[1:]))
        elif name == "INST":
            stack.append(self.call(_LEAF, self.pop_to_mark()))
        elif name == "STACK_GLOBAL":
            self.pop(), self.pop()
            stack.append(_LEAF)
        elif name == "BINPERSID":
            self.pop()
            stack.append(_LEAF)  # the loader's object (a storage), not built from the stream
        elif name == "POP":
            if self.marks and len(stack) == self.marks[-1]:
                self.marks.pop()
            else:
                self.pop()
        elif name == "POP_MARK":
            self.pop_to_mark()
        elif name == "DUP":
            stack.append(self.top())
        elif name == "FRAME":
            left = self.size - (self.pos + 9)  # after the opcode and its 8-byte length
            if not isinstance(arg, int) or arg > left:
                raise self.refuse(f"a frame of {arg} bytes in a stream with {left} left")
        elif name == "STOP":
            self.pop()
            if stack or self.marks:
                raise self.refuse("the stream stops with objects or marks left on the stack")
            return True
        elif name not in _NO_STACK_EFFECT:
            raise self.refuse(f"opcode {name} is not one the scan knows")
        return False


def _size(source: Any) -> int:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    here = source.tell()
    source.seek(0, io.SEEK_END)  # a memory map's seek returns None
    end = source.tell()
    source.seek(here)
    return end


def scan_pickle(source: bytes | bytearray | BinaryIO, what: str, *, max_depth: int = MAX_NESTING) -> int:
    """Check the pickle at the start of ``source`` (bytes, or a seekable binary file positioned at it: a memory
    map serves a large file without reading it whole) against the bounds in the module docstring; returns the
    offset just past its STOP (where a file's next pickle starts) and leaves a file there. Raises
    :class:`PickleRefusedError` naming ``what`` and the byte offset of the first problem."""
    stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    size = _size(source)
    scan = _Scan(what, max_depth, size)
    stack, marks, memo, step, leaves, gets = scan.stack, scan.marks, scan.memo, scan.step, _LEAVES, _GETS
    ops = 0
    try:
        for opcode, arg, pos in pickletools.genops(stream):
            ops += 1
            name = opcode.name
            # the common opcodes of a large pickle inline, in their valid form; anything else (and every error) in step
            if name in leaves:
                stack.append(_LEAF)
            elif name == "MEMOIZE" and len(stack) > (marks[-1] if marks else 0):
                memo[len(memo)] = stack[-1]
            elif name in gets and arg in memo:  # an index stored is one checked
                stack.append(memo[arg])
            elif name == "MARK":
                marks.append(len(stack))
            else:
                scan.pos = pos
                if step(name, arg, ops):
                    return stream.tell()
    except PickleRefusedError:
        raise
    except Exception as exc:  # noqa: BLE001 - genops raises ValueError, UnicodeDecodeError, … on a bad stream
        raise PickleRefusedError(what, f"not a readable pickle ({first_line(exc)}); refusing to unpickle it") from None
    raise PickleRefusedError(what, "the pickle ends before its STOP opcode; refusing to unpickle it")
