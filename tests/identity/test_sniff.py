"""Media signatures: every format docs/inputs.md lists as raw-base64 media is recognised, weak ones are not.

Real files come from `tests.media_samples`; the formats no installed library writes are their
documented leading bytes.
"""

from __future__ import annotations

import array
import struct

import pybase64
import pytest

from tests.media_samples import MEDIA, media_sample
from visioncache import UnsupportedImageTypeError, compute_image_hash
from visioncache.identity.sniff import SNIFF_BYTES, media_kind


def ftyp(brand: bytes) -> bytes:
    return struct.pack(">I", 24) + b"ftyp" + brand + b"\x00\x00\x00\x00" + brand + b"isom"


HEADERS = {
    "heic": (ftyp(b"heic"), "image"),
    "avif": (ftyp(b"avif"), "image"),
    "3gp": (ftyp(b"3gp4"), "video"),
    "jpeg 2000": (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + bytes(20), "image"),
    "jpeg 2000 codestream": (b"\xff\x4f\xff\x51\x00\x2f" + bytes(20), "image"),
    "jpeg xl": (b"\x00\x00\x00\x0cJXL \r\n\x87\n" + bytes(20), "image"),
    "qoi": (b"qoif\x00\x00\x00\x10\x00\x00\x00\x10\x04\x00", "image"),
    "psd": (b"8BPS\x00\x01" + bytes(20), "image"),
    "flv": (b"FLV\x01\x05\x00\x00\x00\x09", "video"),
    "mpeg-ps": (b"\x00\x00\x01\xba\x44\x00\x04\x00\x04\x01", "video"),
    "wmv": (b"\x30\x26\xb2\x75\x8e\x66\xcf\x11\xa6\xd9\x00\xaa\x00\x62\xce\x6c", "video"),
    "ogg theora": (b"OggS\x00\x02" + bytes(20) + b"\x01\x2a\x80theora\x03\x02", "video"),
    "aiff": (b"FORM\x00\x00\x10\x00AIFFCOMM", "audio"),
    "midi": (b"MThd\x00\x00\x00\x06\x00\x01\x00\x02", "audio"),
    "amr": (b"#!AMR\n" + bytes(20), "audio"),
    "caf": (b"caff\x00\x01\x00\x00desc", "audio"),
    "wavpack": (b"wvpk\x20\x00\x00\x00", "audio"),
    "ape": (b"MAC \x96\x0f\x00\x00", "audio"),
}


@pytest.mark.parametrize("name", sorted(MEDIA))
def test_real_files_are_recognised(name: str):
    assert media_kind(media_sample(name)[:SNIFF_BYTES]) == MEDIA[name][1]


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_documented_headers_are_recognised_and_accepted_as_raw_base64(name: str):
    header, kind = HEADERS[name]
    assert media_kind(header) == kind
    payload = header + bytes(range(200))
    assert compute_image_hash(pybase64.b64encode(payload).decode()) == compute_image_hash(payload)


@pytest.mark.parametrize(
    "prefix",
    [
        b"P6\n3 2\n255\n",  # PPM: two bytes of signature
        b"\xff\xfb\x90\x64" + bytes(20),  # MPEG audio frame sync without an ID3 tag
        b"\xff\xf1\x50\x80" + bytes(20),  # ADTS AAC
        b"BM" + bytes(30),  # "BM" with no known DIB header size
        b"ID3\x09\x00" + bytes(20),  # ID3 with an impossible version
        b"\x00\x00\x00\x05ftypisom" + bytes(20),  # ftyp box too small to be one
        b"RIFF\x00\x00\x00\x00TEXT",  # RIFF of an unknown form
        b"\xff\xd8\xff",  # a JPEG start with nothing after it
        b"\x00\x00\x01\x00\x00\x00",  # ICO with no image
        b"",
    ],
)
def test_weak_or_broken_signatures_are_not_media(prefix: bytes):
    assert media_kind(prefix) is None


def test_other_buffer_types_are_refused_as_a_type_error():
    with pytest.raises(UnsupportedImageTypeError, match="ContentId"):
        compute_image_hash(array.array("B", media_sample("png")))
