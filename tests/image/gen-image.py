#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes an OCI image layout (oci:DIR) whose layers the image tests choose, hostile ones
# included: gen-image.py DIR KIND [N]. Layers are built with tarfile, so that the test owns
# every byte (entry types, names, link targets) a real tool would never write.
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile


def entry(tar, name, kind='file', data=b'', mode=0o644, target='', xattrs=None, dev=(0, 0)):
    ti = tarfile.TarInfo(name)
    ti.mode = mode
    ti.mtime = 1700000000
    if kind == 'file':
        ti.size = len(data)
        if xattrs:
            ti.pax_headers = {'SCHILY.xattr.' + k: v for k, v in xattrs.items()}
        tar.addfile(ti, io.BytesIO(data))
        return
    ti.type = {'dir': tarfile.DIRTYPE, 'symlink': tarfile.SYMTYPE, 'hardlink': tarfile.LNKTYPE,
               'chr': tarfile.CHRTYPE, 'blk': tarfile.BLKTYPE, 'fifo': tarfile.FIFOTYPE}[kind]
    ti.linkname = target
    ti.devmajor, ti.devminor = dev
    tar.addfile(ti)


def layer(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w', format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            entry(tar, *e[:2], **(e[2] if len(e) > 2 else {}))
    return buf.getvalue()


def sha(b):
    return 'sha256:' + hashlib.sha256(b).hexdigest()


def write(out, layers, config_extra=None, corrupt=None, compress='gzip'):
    os.makedirs(out + '/blobs/sha256', exist_ok=True)

    def blob(b):
        with open(out + '/blobs/sha256/' + hashlib.sha256(b).hexdigest(), 'wb') as f:
            f.write(b)
        return sha(b)

    descs, diff_ids = [], []
    for i, tar in enumerate(layers):
        if compress == 'zstd':
            gz = subprocess.run(['zstd', '-q', '-c'], input=tar, stdout=subprocess.PIPE,
                                check=True).stdout
        else:
            gz = gzip.compress(tar, mtime=0)
        diff_ids.append(sha(tar))
        d = blob(gz)
        size = len(gz)
        if corrupt == 'digest' and i == len(layers) - 1:
            # the blob on disk is not what its name says: the same tar, the same length,
            # another gzip header
            with open(out + '/blobs/sha256/' + d[7:], 'wb') as f:
                f.write(gzip.compress(tar, mtime=1))
        if corrupt == 'truncated' and i == len(layers) - 1:
            with open(out + '/blobs/sha256/' + d[7:], 'wb') as f:
                f.write(gz[:len(gz) // 2])
        if corrupt == 'diffid' and i == len(layers) - 1:
            diff_ids[-1] = sha(b'something else')
        descs.append({'mediaType': 'application/vnd.oci.image.layer.v1.tar+' + compress,
                      'digest': d, 'size': size})
    config = {'architecture': 'amd64', 'os': 'linux',
              'config': {'Env': ['PATH=/bin:/usr/bin', 'GREETING=hello image'],
                         'WorkingDir': '/work', 'Cmd': ['/bin/sh', '-c', 'exec sleep 1000']},
              'rootfs': {'type': 'layers', 'diff_ids': diff_ids}}
    if config_extra:
        config['config'].update(config_extra)
    cb = json.dumps(config).encode()
    manifest = {'schemaVersion': 2, 'mediaType': 'application/vnd.oci.image.manifest.v1+json',
                'config': {'mediaType': 'application/vnd.oci.image.config.v1+json',
                           'digest': blob(cb), 'size': len(cb)},
                'layers': descs}
    mb = json.dumps(manifest).encode()
    index = {'schemaVersion': 2, 'manifests': [
        {'mediaType': 'application/vnd.oci.image.manifest.v1+json', 'digest': blob(mb),
         'size': len(mb), 'annotations': {'org.opencontainers.image.ref.name': 'test'}}]}
    with open(out + '/index.json', 'w') as f:
        json.dump(index, f)
    with open(out + '/oci-layout', 'w') as f:
        json.dump({'imageLayoutVersion': '1.0.0'}, f)


BASE = [('bin', 'dir', {'mode': 0o755}), ('etc', 'dir', {'mode': 0o755}),
        ('etc/passwd', 'file', {'data': b'root:x:0:0:root:/root:/bin/sh\n'
                                        b'agent:x:1234:1234::/home/agent:/bin/sh\n'}),
        ('etc/group', 'file', {'data': b'root:x:0:\nagent:x:1234:\nextra:x:2000:other,agent\n'
                                       b'none:x:2001:other\n'}),
        ('gone', 'file', {'data': b'deleted by layer 2\n'}),
        ('opq', 'dir', {'mode': 0o755}), ('opq/old', 'file', {'data': b'hidden\n'}),
        ('data', 'file', {'data': b'shared bytes\n', 'mode': 0o640})]


def main():
    out, kind = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    busybox = '/bin/busybox'
    bb = open(busybox, 'rb').read() if os.path.exists(busybox) else b''
    base = BASE + [('bin/busybox', 'file', {'data': bb, 'mode': 0o755}),
                   ('bin/sh', 'hardlink', {'target': 'bin/busybox'}),
                   ('bin/sleep', 'symlink', {'target': 'busybox'}),
                   ('work', 'dir', {'mode': 0o755})]
    top = [('.wh.gone', 'file'), ('opq/.wh..wh..opq', 'file'),
           ('opq/new', 'file', {'data': b'visible\n'}),
           ('link-a', 'file', {'data': b'one inode\n', 'xattrs': {'user.belayer': 'kept'}}),
           ('link-b', 'hardlink', {'target': 'link-a'}),
           ('setuid', 'file', {'data': b'x', 'mode': 0o4755})]
    hostile = {
        'dotdot': [('../escape', 'file', {'data': b'x'})],
        'absolute': [('/abs-escape', 'file', {'data': b'x'})],
        'device': [('dev-null', 'chr', {'dev': (1, 3)})],
        'symlink-write': [('evil', 'symlink', {'target': '/tmp'}),
                          ('evil/through-symlink', 'file', {'data': b'x'})],
        # the symlink is an intermediate component of an existing directory's path: only
        # RESOLVE_NO_SYMLINKS stops it (O_NOFOLLOW looks at the last component alone)
        'symlink-deep': [('evil', 'symlink', {'target': '/'}),
                         ('evil/tmp/belayer-image-escape', 'file', {'data': b'x'})],
        'hardlink-across': [('steal', 'hardlink', {'target': 'data'})],
        'hardlink-out': [('steal', 'hardlink', {'target': '../../../../etc/shadow'})],
        'overlay-xattr': [('redir', 'file',
                           {'data': b'x', 'xattrs': {'trusted.overlay.redirect': '/etc'}})],
    }
    if kind == 'good':
        write(out, [layer(base), layer(top)])
    elif kind == 'zstd':
        write(out, [layer(base), layer(top + [('zstd', 'file')])], compress='zstd')
    elif kind == 'many':
        layers = [layer(base)] + [layer([('layer%02d' % i, 'file', {'data': b'%d\n' % i})])
                                  for i in range(1, n)]
        write(out, layers)
    elif kind in ('digest', 'truncated', 'diffid'):
        # a top layer of its own: one the store holds already is not read again
        write(out, [layer(base), layer(top + [(kind, 'file')])], corrupt=kind)
    elif kind in hostile:
        write(out, [layer(base), layer([('ok-before', 'file', {'data': b'x'})] +
                                       hostile[kind])])
    elif kind == 'noshell':
        write(out, [layer([('hello', 'file', {'data': b'x'})])], config_extra={'Cmd': None})
    elif kind == 'user':
        write(out, [layer(base)], config_extra={'User': 'agent'})
    else:
        sys.exit('unknown kind ' + kind)


main()
