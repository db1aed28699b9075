# Sourced by the scripts that read the headline's runs (reference.sh, headline_sliding.sh,
# new_schemes.sh): `study`, the budget study's folder at the reference budget (its runs share the
# preset's config hash), `sweep`, the preset's own folder (STUDY and SWEEP move them), and
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
