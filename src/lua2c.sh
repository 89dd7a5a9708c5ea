#!/bin/sh
# Turns the Lua scripts into C strings so the daemon carries them in its
# binary: usage lua2c.sh OUTBASE file.lua...  writes OUTBASE.c and OUTBASE.h.
# Temporary names carry the pid: make -j may run the rule twice at once.
set -e
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
    echo "#endif"
} > "$tmph"
{
    echo "/* generated from the scripts in src/lua by lua2c.sh; do not edit */"
    echo "#include \"ld_lua.h\""
    for f in "$@"; do
        n=$(basename "$f" .lua)
        echo "const char ld_lua_$n[] ="
        sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/' "$f"
        echo "    ;"
    done
} > "$tmpc"
mv "$tmph" "$out.h"
mv "$tmpc" "$out.c"
