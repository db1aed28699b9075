# Sourced by headline_sliding.sh, which reads the headline's run dirs: `study`, the budget study's
# folder at the reference budget (its runs share the preset's config hash), `sweep`, the folder
# `posbench study headline` trains into (STUDY and SWEEP move them), and
# `find_headline`, which sets `headline` to those of the two that exist.
steps=$(python -c "from omegaconf import OmegaConf; print(OmegaConf.load('conf/experiment/reference.yaml').train.steps)")
study=${STUDY:-outputs/budget_study/default}/steps=$steps
sweep=${SWEEP:-outputs/reference}
find_headline() {
    headline=()
    for d in "$study" "$sweep"; do
        if [ -d "$d" ]; then headline+=("$d"); fi
    done
}
