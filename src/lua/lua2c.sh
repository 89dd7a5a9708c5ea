#!/bin/sh
# Turns the Lua scripts into C strings so the daemon carries them in its
# binary: usage lua2c.sh OUTBASE file.lua...  writes OUTBASE.c and OUTBASE.h.
# A line "--@include NAME" is replaced by src/lua/lib/NAME (in a lib file
# too): Redis scripts cannot share code at run time, so the shared parts
# are pasted in here.
# A line "--@batchable" marks a script that may run as one item of the
# batch script (ld_redis_batch.c): ld_lua_batchable[] lists the marks.
# Temporary names carry the pid: make -j may run the rule twice at once.
set -e

expand() {
    awk -v lib="$(dirname "$1")/lib" '
        # A lib file may include another (a lazily created set of
        # checks inside a function of its own).
        function put(path,    line, r, w) {
            while ((r = (getline line < path)) > 0) {
                indented(line)
                if (line ~ /^--@include /) {
                    split(line, w, " ")
                    put(lib "/" w[2])
                } else {
                    print line
                }
            }
            if (r < 0) {
                print "lua2c.sh: cannot read " path > "/dev/stderr"
                exit 1
            }
            close(path)
        }
        # An indented mark would be left in as a comment, its code missing.
        function indented(line) {
            if (line ~ /^[ \t]+--@include /) {
                print "lua2c.sh: an indented --@include: " line > "/dev/stderr"
                exit 1
            }
        }
        { indented($0) }
        /^--@include / {
            put(lib "/" $2)
            next
        }
        { print }' "$1"
}
out=$1; shift
tmpc="$out.c.tmp.$$"; tmph="$out.h.tmp.$$"
{
    echo "/* generated from the scripts in src/lua by lua2c.sh; do not edit */"
    echo "#ifndef LD_LUA_H"
    echo "#define LD_LUA_H"
    printf '#define LD_LUA_SCRIPTS(X)'
    for f in "$@"; do
        n=$(basename "$f" .lua)
        printf ' \\\n    X(%s)' "$n"
    done
    echo
    for f in "$@"; do
        n=$(basename "$f" .lua)
        echo "extern const char ld_lua_$n[];"
    done
    echo "extern const unsigned char ld_lua_batchable[];"
    echo "#endif"
} > "$tmph"
{
    echo "/* generated from the scripts in src/lua by lua2c.sh; do not edit */"
    echo "#include \"ld_lua.h\""
    for f in "$@"; do
        n=$(basename "$f" .lua)
        echo "const char ld_lua_$n[] ="
        expand "$f" > "$tmpc.src"
        sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/' "$tmpc.src"
        echo "    ;"
    done
    echo "const unsigned char ld_lua_batchable[] = {"
    for f in "$@"; do
        if grep -q '^--@batchable' "$f"; then echo "    1,"; else echo "    0,"; fi
    done
    echo "};"
} > "$tmpc"
rm -f "$tmpc.src"
mv "$tmph" "$out.h"
mv "$tmpc" "$out.c"
