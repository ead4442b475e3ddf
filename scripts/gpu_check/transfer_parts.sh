# Sourced by scripts/gpu_wheels.sh and scripts/gpu_check/smollm2_parts.sh: a folder packed
# into one tar split into parts that travel one per transfer (a transfer takes the working
# tree and the carried files together, 64 MiB at most), and each part's carry command.

# pack_parts DIR NAME SOURCE PART_SIZE: SOURCE's files as DIR/NAME.tar.part-aa, -ab, ...
pack_parts() {
    local dir="$1" name="$2" source="$3" part_size="$4"
    rm -f "$dir/$name.tar" "$dir/$name.tar.part-"*
    tar -C "$source" -cf "$dir/$name.tar" .
    split -b "$part_size" "$dir/$name.tar" "$dir/$name.tar.part-"
    rm "$dir/$name.tar"
}

# report_parts ROOT DIR NAME: fails where the working tree and one part exceed a transfer;
# prints the transfers that move each part into /tmp/iw-wheels.
report_parts() {
    local root="$1" dir="$2" name="$3" tree_bytes part_bytes rel part
    tree_bytes=$(cd "$root" && git ls-files -z --cached --others --exclude-standard \
        | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
    part_bytes=$(stat -c %s "$(ls "$dir/$name".tar.part-* | head -1)")
    echo "$(ls "$dir/$name".tar.part-* | wc -l) parts of $name; working tree" \
        "$(numfmt --to=iec "$tree_bytes") + one part $(numfmt --to=iec "$part_bytes")" \
        "travel together (at most 64 MiB a transfer)"
    if [ $(( tree_bytes + part_bytes )) -gt $(( 64 * 1024 * 1024 )) ]; then
        echo "too big for one transfer: use a smaller --part-size" >&2
        return 1
    fi
    rel="$(realpath --relative-to="$root" "$dir")"
    for part in "$dir/$name".tar.part-*; do
        echo "  carry [\"$rel/$(basename "$part")\"], command:" \
            "mkdir -p /tmp/iw-wheels && mv $rel/$(basename "$part") /tmp/iw-wheels/"
    done
}
