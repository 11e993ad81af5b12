"""Which kind of media do these bytes start? Strong container signatures only.

Identity does not depend on the answer: content is hashed whatever its format. The answer decides
one thing, whether a string that names no file is raw base64 of media (so a typo'd file name is
refused instead of being hashed as content), and it can label stats.

Only signatures of at least four distinctive bytes (or three plus a checked structure) are listed,
because a false match turns a mistyped name into content. General-purpose sniffers (Pillow's
``accept`` checks, ``filetype``) also accept one- and two-byte prefixes (PPM's ``P6``, MPEG audio's
frame sync ``FF FB``, ADTS ``FF F1``) that a short base64-looking name decodes to often enough;
such formats are still accepted as bytes, files and ``data:`` URLs, just not as bare base64.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["SNIFF_BYTES", "MediaKind", "media_kind"]

MediaKind = Literal["image", "video", "audio"]

SNIFF_BYTES = 64  # how many leading bytes media_kind looks at

# Signatures at offset 0.
_SIGNATURES: tuple[tuple[bytes, MediaKind], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image"),
    (b"GIF87a", "image"),
    (b"GIF89a", "image"),
    (b"II*\x00", "image"),  # TIFF, little-endian
    (b"MM\x00*", "image"),  # TIFF, big-endian
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "image"),  # JPEG 2000 (JP2)
    (b"\xff\x4f\xff\x51", "image"),  # JPEG 2000 codestream
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "image"),  # JPEG XL container
    (b"qoif", "image"),
    (b"8BPS", "image"),  # Photoshop
    (b"\x1a\x45\xdf\xa3", "video"),  # EBML: Matroska, WebM
    (b"FLV\x01", "video"),
    (b"\x00\x00\x01\xba", "video"),  # MPEG program stream
    (b"\x00\x00\x01\xb3", "video"),  # MPEG-1/2 video sequence header
    (b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", "video"),  # ASF: WMV, WMA
    (b"fLaC", "audio"),
    (b"MThd\x00\x00\x00\x06", "audio"),  # MIDI
    (b"#!AMR", "audio"),
    (b"caff", "audio"),  # Core Audio
    (b"wvpk", "audio"),  # WavPack
    (b"MAC ", "audio"),  # Monkey's Audio
)
# The same, indexed by their first four bytes: one dict lookup instead of a scan.
_BY_HEAD: dict[bytes, list[tuple[bytes, MediaKind]]] = {}
for _signature, _kind in _SIGNATURES:
    _BY_HEAD.setdefault(_signature[:4], []).append((_signature, _kind))

# RIFF / FORM containers: the form type at offset 8 says what they hold.
_RIFF_FORMS: dict[bytes, MediaKind] = {b"WEBP": "image", b"AVI ": "video", b"WAVE": "audio"}
_AIFF_FORMS = (b"AIFF", b"AIFC")
# ISO base media (MP4, MOV, 3GP, HEIF/AVIF, M4A): the ``ftyp`` box's major brand.
_IMAGE_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"avif", b"avis")
_AUDIO_BRANDS = (b"M4A ", b"M4B ", b"M4P ", b"F4A ", b"F4B ")
_BMP_HEADER_SIZES = (12, 40, 52, 56, 64, 108, 124)


def media_kind(prefix: bytes) -> MediaKind | None:
    """``"image"``, ``"video"`` or ``"audio"`` if ``prefix`` (a file's first `SNIFF_BYTES` bytes)
    starts a known media container; None otherwise (which does not mean it is not media)."""
    head = prefix[:4]
    for signature, kind in _BY_HEAD.get(head, ()):
        if prefix.startswith(signature):
            return kind
    if head == b"RIFF":
        return _RIFF_FORMS.get(prefix[8:12])
    if head == b"FORM":
        return "audio" if prefix[8:12] in _AIFF_FORMS else None
    if prefix[4:8] == b"ftyp":
        return _iso_media_kind(prefix)
    if head == b"OggS":
        return "video" if b"\x80theora" in prefix[:SNIFF_BYTES] else "audio"
    if prefix[:3] == b"\xff\xd8\xff" and len(prefix) > 3 and prefix[3] >= 0xC0:
        return "image"  # JPEG: start-of-image, then a marker
    if prefix[:3] == b"ID3" and _is_id3v2_header(prefix):
        return "audio"  # MP3 (or AAC) with an ID3v2 tag
    if prefix[:2] == b"BM" and len(prefix) >= 18:
        # BMP: the DIB header's size must be one of its known versions.
        return "image" if int.from_bytes(prefix[14:18], "little") in _BMP_HEADER_SIZES else None
    if head == b"\x00\x00\x01\x00" and len(prefix) >= 6 and prefix[4:6] != b"\x00\x00":
        return "image"  # ICO with at least one image
    return None


def _iso_media_kind(prefix: bytes) -> MediaKind | None:
    box_size = int.from_bytes(prefix[:4], "big")
    if box_size < 16 or box_size % 4 or box_size > 4096:
        return None
    brand = prefix[8:12]
    if brand in _IMAGE_BRANDS:
        return "image"
    if brand in _AUDIO_BRANDS:
        return "audio"
    return "video" if brand.strip().isalnum() else None  # brands are printable: "isom", "qt  "


def _is_id3v2_header(prefix: bytes) -> bool:
    # "ID3", major version 2-4, revision 0, flags, then a 28-bit size in four 7-bit bytes.
    size = prefix[6:10]
    return len(size) == 4 and prefix[3] in (2, 3, 4) and prefix[4] == 0 and all(byte < 0x80 for byte in size)
