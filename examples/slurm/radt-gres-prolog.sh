#!/bin/sh
# radt's PrologSlurmctld: keep which GPUs each node gave the job in its AdminComment.
#
# Slurm's accounting keeps no GPU index (no sacct field, not --json, not the database); `scontrol show job -d`
# shows them (GRES=gpu:2(IDX:0-1)) only while the job runs. This copies them, per node, into the job's
# AdminComment, which sacct keeps, as `radt-gres=NODES>GRES;NODES>GRES`, after what the comment held already.
# `radt import --slurm` reads it to take each job's own GPU series and no other job's.
# Install: copy to /etc/slurm/, chmod 755, add `PrologSlurmctld=/etc/slurm/radt-gres-prolog.sh` to slurm.conf,
# restart slurmctld (a reconfigure does not start running a new PrologSlurmctld).
[ -n "$SLURM_JOB_ID" ] || exit 0
out=$(scontrol -o -d show job "$SLURM_JOB_ID" 2>/dev/null)
# The job's name is any text its user gave, spaces and line breaks included: a name "x Nodes=n1 GRES=gpu:8(IDX:0-7)"
# read as fields would give the job GPUs it never had. So only what follows the name (Slurm gives it exactly, as
# SLURM_JOB_NAME) is read, and of that only the fields up to the nodes' GRES (MinCPUsNode= follows them; later
# fields, such as Command, WorkDir and Comment, are the user's text again).
case "$out" in "JobId=$SLURM_JOB_ID JobName=$SLURM_JOB_NAME "*) ;; *) exit 0 ;; esac
rest=${out#"JobId=$SLURM_JOB_ID JobName=$SLURM_JOB_NAME "}
fields=${rest%%" MinCPUsNode="*}
gres=$(printf '%s\n' "$fields" | tr ' ' '\n' | awk -F= '$1 == "Nodes" { n = $2 } $1 == "GRES" && n != "" { sub(/^GRES=/, ""); print n ">" $0; n = "" }' | paste -sd';' -)
[ -n "$gres" ] || exit 0
# What the AdminComment held is kept only where it is the one field of that name: the job's script, folder and comment
# are its user's text too, and an "AdminComment=radt-gres=..." among them once stopped this copy. An earlier radt-gres
# (a requeued job) is replaced by this start's.
old=""
if [ "$(printf '%s\n' "$rest" | tr ' ' '\n' | grep -c '^AdminComment=')" = 1 ]; then
  old=$(printf '%s\n' "$rest" | tr ' ' '\n' | sed -n 's/^AdminComment=//p' | sed 's/(null)//; s/radt-gres=[^ ]*//; s/ *$//')
fi
scontrol update jobid="$SLURM_JOB_ID" AdminComment="${old:+$old }radt-gres=$gres" || true
exit 0
