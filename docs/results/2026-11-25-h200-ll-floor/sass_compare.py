#!/usr/bin/env python3
"""Whether two builds' kernels are the same machine code, kernel by kernel.

    sass_compare.py NVDISASM OLD NEW

OLD and NEW are each a fatbin (target/release/build/nixl-device-examples-*/out/
kernels.fatbin), a program that embeds one (a bundle's bin/simple_write), or
a cubin (nvcc -cubin).
The first sm_90 cubin in each is disassembled with NVDISASM (pip package
nvidia-cuda-nvdisasm), and each kernel's instructions are compared with
label numbers ignored. Prints one line per kernel: IDENTICAL, differs, or
only in one build.
"""
import re
import struct
import subprocess
import sys
import tempfile


def cubin(path):
    data = open(path, "rb").read()
    if data.startswith(b"\x7fELF") and b"\x50\xed\x55\xba" not in data:
        return data  # a cubin already (nvcc -cubin)
    at = data.find(b"\x50\xed\x55\xba")  # fatbin magic
    if at < 0:
        sys.exit(f"{path}: no fatbin")
    entry = at + struct.unpack_from("<H", data, at + 6)[0]  # header size
    header, size = struct.unpack_from("<IQ", data, entry + 4)
    return data[entry + header : entry + header + size]


def kernels(nvdisasm, path):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin(path))
        f.flush()
        text = subprocess.run([nvdisasm, "-c", f.name], check=True, capture_output=True, text=True).stdout
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*\.text\.(\w+):", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        line = re.sub(r"/\*[0-9a-f]*\*/|/\* 0x[0-9a-f]* \*/", "", line).strip()
        skip = line.startswith(("//", ".section", ".global", ".type", ".size", ".other", ".align"))
        if name and line and not skip and not re.fullmatch(r"\w+:", line):  # not the next kernel's name
            out[name].append(re.sub(r"L_x_\d+", "L", line))
    return out


def main():
    nvdisasm, old, new = sys.argv[1:4]
    a, b = kernels(nvdisasm, old), kernels(nvdisasm, new)
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print(f"{k}: only in {'old' if k in a else 'new'}")
        else:
            print(f"{k}: {'IDENTICAL' if a[k] == b[k] else 'differs'}")


main()
