"""A chat request's body as vLLM's OpenAI server will read it once its handles and client ``uuid`` s
are dealt with: every ``visioncache://`` image becomes the verified kept bytes (a base64 ``data:``
URL) under a server-derived ``uuid``, and every identifier a client sent is refused or scoped.

Where vLLM reads media and their identifiers: a content part (a dict in a ``content`` or
``content_parts`` list: chat messages, the Responses API's input items, token-in/token-out
requests), its ``image_url`` (a string or ``{"url": ...}``) or ``url``, its ``uuid``; and a
prompt's ``multi_modal_uuids`` (``{modality: [uuid or null, ...]}``, or one uuid).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pybase64

from visioncache.errors import InvalidArgumentError
from visioncache.integrations.handles import is_handle

__all__ = ["ClientIdRefusedError", "Found", "find", "rewrite"]

_PART_LISTS = frozenset({"content", "content_parts"})
_UUIDS = "multi_modal_uuids"
_MIME = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))


class ClientIdRefusedError(InvalidArgumentError):
    """A client named a media item (``uuid``, ``multi_modal_uuids``) on a server that refuses it."""

    status = 400
    code = "client_media_id_refused"


@dataclass
class Found:
    """What a request body holds that the server must act on."""

    handles: list[str] = field(default_factory=list)  # in order, repeats kept
    client_ids: int = 0  # identifiers the client sent (uuid, multi_modal_uuids entries)


def _parts(node: Any, in_part_list: bool = False) -> Iterator[dict[str, Any]]:
    """Every content part in ``node``, and every dict holding ``multi_modal_uuids``."""
    if isinstance(node, dict):
        if in_part_list or _UUIDS in node:
            yield node
        for key, value in node.items():
            yield from _parts(value, key in _PART_LISTS and isinstance(value, list))
    elif isinstance(node, list):
        for value in node:
            yield from _parts(value, in_part_list)


def _image_slot(part: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """Where a part's image URL is: (the dict holding it, its key), or None."""
    image = part.get("image_url")
    if isinstance(image, dict) and isinstance(image.get("url"), str):
        return image, "url"
    if isinstance(image, str):
        return part, "image_url"
    if isinstance(part.get("url"), str) and part.get("type", "image_url") == "image_url":
        return part, "url"
    return None


def _ids(uuids: Any) -> list[str]:
    """The identifiers a ``multi_modal_uuids`` value names (nulls are no identifier)."""
    if isinstance(uuids, dict):
        return [one for value in uuids.values() for one in _ids(value)]
    if isinstance(uuids, list):
        return [one for value in uuids for one in _ids(value)]
    return [] if uuids is None else [str(uuids)]


def find(document: Any) -> Found:
    """The handles (in image slots) and client identifiers of a parsed request body."""
    found = Found()
    for part in _parts(document):
        if part.get("uuid") is not None:
            found.client_ids += 1
        found.client_ids += len(_ids(part.get(_UUIDS)))
        slot = _image_slot(part)
        if slot is not None and is_handle(slot[0][slot[1]]):
            found.handles.append(slot[0][slot[1]])
    return found


def _scoped(uuids: Any, scope: Callable[[str], str]) -> Any:
    if isinstance(uuids, dict):
        return {key: _scoped(value, scope) for key, value in uuids.items()}
    if isinstance(uuids, list):
        return [_scoped(value, scope) for value in uuids]
    return None if uuids is None else scope(str(uuids))


def data_url(data: bytes) -> str:
    """``data`` as a base64 ``data:`` URL (vLLM decodes it whatever the media type says)."""
    mime = next((name for magic, name in _MIME if data.startswith(magic)), "application/octet-stream")
    return f"data:{mime};base64," + pybase64.b64encode(data).decode("ascii")


def rewrite(
    document: Any,
    media: dict[str, tuple[str, str]],
    scope_client_id: Callable[[str], str] | None,
) -> None:
    """Rewrite ``document`` in place for vLLM.

    Args:
        document: the parsed request body.
        media: handle -> (the ``data:`` URL of its verified bytes, its server-derived ``uuid``).
        scope_client_id: what a client's identifier becomes; None refuses any.

    Raises:
        ClientIdRefusedError: a client identifier where they are refused (nothing rewritten then).
    """
    if scope_client_id is None and find(document).client_ids:
        raise ClientIdRefusedError(
            "this server does not take client media identifiers (a part's 'uuid', "
            "'multi_modal_uuids'): a name chosen by a client could make another request's image "
            "stand for this one. Send the image (inline or as a visioncache:// handle) without one"
        )
    for part in list(_parts(document)):
        if scope_client_id is not None:
            if part.get("uuid") is not None:
                part["uuid"] = scope_client_id(str(part["uuid"]))
            if part.get(_UUIDS) is not None:
                part[_UUIDS] = _scoped(part[_UUIDS], scope_client_id)
        slot = _image_slot(part)
        if slot is not None and is_handle(slot[0][slot[1]]):
            url, uuid = media[slot[0][slot[1]]]
            slot[0][slot[1]] = url
            part["uuid"] = uuid
