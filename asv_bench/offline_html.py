"""Make a copy of asv's published site that needs no CDN (for machines without one, and for the screenshot).

asv's pages load jQuery, flot, bootstrap, stupidtable and blueimp-md5 from
CDNs. This copies ``html/`` to OUT and points those tags at files of the same
versions taken from npm packages in NODE_MODULES (without the CDN's integrity
hashes, which are of its minified builds):

    npm install jquery@3.3.1 flot@0.8.3 flot-orderbars@1.0.0 stupid-table-plugin@1.1.3 \\
        blueimp-md5@2.19.0 bootstrap@3.1.1
    python offline_html.py html node_modules html-offline
    python -m http.server --directory html-offline 8765
"""

from __future__ import annotations

import pathlib
import re
import shutil
import sys

#: a CDN address (regular expression) -> the file inside node_modules that holds the same code
VENDORED = {
    r"https://code\.jquery\.com/jquery-3\.3\.1\.min\.js": "jquery/dist/jquery.min.js",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/flot/0\.8\.3/jquery\.flot\.min\.js": "flot/jquery.flot.js",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/flot/0\.8\.3/jquery\.flot\.(\w+)\.min\.js": r"flot/jquery.flot.\1.js",
    r"https://cdn\.jsdelivr\.net/npm/flot-orderbars@1\.0\.0/js/jquery\.flot\.orderBars\.js":
        "flot-orderbars/js/jquery.flot.orderBars.js",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/stupidtable/1\.0\.1/stupidtable\.min\.js":
        "stupid-table-plugin/stupidtable.min.js",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/blueimp-md5/2\.19\.0/js/md5\.min\.js": "blueimp-md5/js/md5.min.js",
    r"https://cdn\.jsdelivr\.net/npm/bootstrap@3\.1\.1/dist/(css|js)/bootstrap\.min\.(css|js)":
        r"bootstrap/dist/\1/bootstrap.min.\2",
}


def main(html: str, node_modules: str, out: str) -> int:
    source, modules, target = pathlib.Path(html), pathlib.Path(node_modules), pathlib.Path(out)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    vendor = target / "vendor"
    vendor.mkdir()
    def local_copy(match: re.Match, local: str) -> str:
        relative = match.expand(local)
        name = relative.replace("/", "_")
        shutil.copyfile(modules / relative, vendor / name)
        return f"vendor/{name}"

    for page in target.glob("*.html"):
        text = page.read_text()
        for pattern, local in VENDORED.items():
            text = re.sub(pattern, lambda m, local=local: local_copy(m, local), text)
        # the CDN's integrity hashes are of its minified builds: local copies are checked by npm instead
        text = re.sub(r'(src|href)="(vendor/[^"]+)" integrity="[^"]*"', r'\1="\2"', text)
        page.write_text(text)
    left = sorted({m for page in target.glob("*.html") for m in re.findall(r'(?:src|href)="(https://[^"]+\.(?:js|css))"',
                                                                             page.read_text())})
    if left:
        print("still on a CDN:", *left, sep="\n  ", file=sys.stderr)
        return 1
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
