"""Zero the payload of every GPU machine-code (ELF) image in a shared object's .nv_fatbin
section whose SM architecture is not in KEEP. Headers, PTX and the kept images stay
byte-identical, so the file keeps its size and layout; only the dropped payloads become
zeros (which xz then compresses to nothing). The CUDA driver reads the entry headers to
pick the image for the device (sm_90 SASS, else PTX to JIT) and never decompresses the
others. Usage: python3 prune_fatbin.py IN.so OUT.so 90"""
import struct
import sys


def section(data, name):
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def hdr(i):
        b = shoff + i * shentsize
        nm, = struct.unpack_from("<I", data, b)
        off, size = struct.unpack_from("<QQ", data, b + 0x18)
        return nm, off, size
    _, stroff, _ = hdr(shstrndx)
    for i in range(shnum):
        nm, off, size = hdr(i)
        end = data.index(b"\0", stroff + nm)
        if data[stroff + nm:end].decode() == name:
            return off, size
    raise SystemExit(f"no {name} section")

def main(src, dst, keep):
    keep = {int(a) for a in keep.split(",")}
    data = bytearray(open(src, "rb").read())
    off, size = section(data, ".nv_fatbin")
    p, end, kept, dropped = off, off + size, 0, 0
    while p < end:
        magic, _ver, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
        if magic != 0xBA55ED50:          # padding between fatbins
            p += 8
            continue
        q, fend = p + hsz, p + hsz + fsz
        while q < fend:
            kind, _v, ehsz, esz = struct.unpack_from("<HHIQ", data, q)
            arch, = struct.unpack_from("<I", data, q + 28)
            if kind == 2 and arch not in keep:   # 1 = PTX, 2 = ELF (SASS)
                data[q + ehsz:q + ehsz + esz] = bytes(esz)
                dropped += esz
            else:
                kept += esz
            q += ehsz + esz
        p = fend
    open(dst, "wb").write(data)
    print(f"{src}: kept {kept} B, zeroed {dropped} B of machine code for other GPUs")

if __name__ == "__main__":
    main(*sys.argv[1:4])
