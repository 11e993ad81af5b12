"""Video handles' parts without a server: the kind sealed in a handle, where a request names a
video's handle, and a request body rewritten with the kept video (`video_handles`)."""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("cryptography", reason="handles need cryptography (pip install 'visioncache[vllm-mlx]')")

from visioncache.integrations.handles import DigestedImage, Handles
from visioncache.integrations.handles.handle_codec import (
    HandleCodec,
    HandleExpiredError,
    UnknownHandleError,
    WrongKindHandleError,
)
from visioncache.integrations.vllm_mlx.handle_api import handle_urls, media_handles
from visioncache.integrations.vllm_mlx.video_handles import inline_videos

VIDEO = b"\x00\x00\x00\x18ftypisom" + bytes(range(200))  # an MP4's first box, then anything


def test_a_handle_opens_only_as_the_kind_it_was_sealed_for() -> None:
    codec, digest = HandleCodec("tenant"), bytes(range(32))
    image, video = codec.seal(digest), codec.seal(digest, "video")
    assert image != video and codec.seal(digest, "image") == image  # image handles: unchanged
    assert codec.open(image) == codec.open(video, "video") == digest
    with pytest.raises(WrongKindHandleError, match="video handle is used where an image goes"):
        codec.open(video)
    with pytest.raises(WrongKindHandleError, match="image handle is used where a video goes"):
        codec.open(image, "video")
    with pytest.raises(UnknownHandleError):  # another tenant's video handle is unknown, not "wrong kind"
        HandleCodec("other").open(video, "video")
    assert WrongKindHandleError.status == 400 and WrongKindHandleError.code == "wrong_handle_kind"


def test_video_handles_are_found_where_videos_go_and_image_handles_where_images_go() -> None:
    codec = HandleCodec(None)
    image, video = codec.seal(bytes(32)), codec.seal(bytes(32), "video")
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}}]},
            {"role": "user", "content": [{"type": "video", "video": video + "x"}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]},
            {"role": "user", "content": [{"type": "text", "text": video}]},  # text mentioning one
        ]
    }
    encoded = json.dumps(body).encode()
    assert media_handles(encoded) == [(video, "video"), (video + "x", "video"), (image, "image")]
    assert handle_urls(encoded) == [image]  # a video_url's "url" is no image (it was, before videos)


def test_a_request_names_its_kept_video_as_the_data_url_sent_inline() -> None:
    handles = Handles("tenant", None, "1MiB")
    (digest,) = handles.kept.image_digests([VIDEO])
    (issued,) = handles.keep([DigestedImage(digest, VIDEO)], "video")
    assert issued.kept
    part = {"type": "video_url", "video_url": {"url": issued.handle}}
    body = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": issued.handle}]}]}
    rewritten = json.loads(inline_videos(json.dumps(body).encode(), handles))
    video_part, text_part = rewritten["messages"][0]["content"]
    assert video_part["video_url"]["url"] == "data:video/mp4;base64," + base64.b64encode(VIDEO).decode()
    assert text_part["text"] == issued.handle  # only where a video goes
    assert handles.stats.handles_resolved == 1
    handles.kept.discard_images([VIDEO])
    with pytest.raises(HandleExpiredError):
        inline_videos(json.dumps(body).encode(), handles)
    assert handles.stats.handles_missing == 1
