# Writes outputs onto a full 64 KiB tmpfs over existing ones and reports the
# exit code, whether every old output is byte-identical afterwards, and what
# the disk holds (a temporary left behind would show). Run under
# `unshare -m`, so the mount ends with the script.
#
# Usage: bash full-disk.sh DIR OUTPUT... -- FIRST... -- SECOND...
# FIRST writes the OUTPUTs (files in DIR/disk) on the empty disk; the disk is
# then filled and SECOND runs. Both name the disk DISK.
set -u
dir=$1
shift
outputs=() first=() second=()
while [ "$1" != "--" ]; do outputs+=("$1"); shift; done
shift
while [ "$1" != "--" ]; do first+=("${1//DISK/$dir/disk}"); shift; done
shift
for arg in "$@"; do second+=("${arg//DISK/$dir/disk}"); done

rm -rf "$dir" && mkdir -p "$dir/disk" "$dir/old" || exit 1
mount -t tmpfs -o size=64k tmpfs "$dir/disk" || exit 1
"${first[@]}" || exit 1
for output in "${outputs[@]}"; do
  cp "$dir/disk/$output" "$dir/old/$output" || exit 1
done
head -c 1048576 /dev/zero > "$dir/disk/fill" 2>/dev/null
"${second[@]}"
echo "rc=$?"
for output in "${outputs[@]}"; do
  if cmp -s "$dir/old/$output" "$dir/disk/$output"; then
    echo "unchanged $output"
  else
    echo "CHANGED $output"
  fi
done
echo "disk holds:" $(ls -A "$dir/disk")
umount "$dir/disk"
